-- Read devices of one shard for Store.Device, Store.List, the snapshot,
-- Store.Counts and Store.Gateways.
-- KEYS: exp, dev, events, epochs, inv, held, gateways, idx (record.lua;
-- exp, dev, epochs and idx are used here).
-- ARGV: "get", device
--    or "views", device...
--    or "scan", HSCAN cursor, items of that cursor's step already returned,
--       limit, HSCAN COUNT (the same on every call, so that a step at a
--       cursor holds the same items)
--    or "keys", order ("id" or "changed"), state filter, ID prefix, the
--       cursor key's since (ms; "" for none) and device ("" for none),
--       limit
--    or "counts", suspect window ms, now ms or ""
--    or "gateways".
-- A device view is {device, online (1|0), ver, since, last gw, last session,
-- deadline or -1, {session, deadline, gw, epoch, ...}}.
-- "get" returns {view} or {}; "scan" returns {cursor, skip, views...}: the
-- HSCAN cursor to resume at and how many items of its step to pass over;
-- cursor "0" with skip 0 means the shard is done. A small hash is a
-- listpack, which HSCAN returns whole in one step in insertion order; a
-- page that stops inside it resumes at cursor LISTPACK. A hash becomes a
-- hash table when it grows (or a record outgrows a listpack value), and
-- its steps then hold other items: a page resuming at LISTPACK then starts
-- the shard again (a device may be returned twice, none is missed).
local LISTPACK = 'lp'

-- special says whether a field of the device hash is not a device (INC,
-- ONLINE_COUNT: no device ID starts with INC's character).
local function special(field)
  return sub(field, 1, 1) == INC
end

local function view(dev, packed)
  local dl = false
  if isonline(packed) then
    dl = tonumber(redis.call('ZSCORE', KEYS[1], dev))
  end
  local r = decode(packed, dl)
  local sess = {}
  for _, ss in ipairs(r.sess) do
    sess[#sess + 1] = ss.sid
    sess[#sess + 1] = ss.dl
    sess[#sess + 1] = gwname(ss.gw)
    sess[#sess + 1] = ss.ep
  end
  return {dev, r.on and 1 or 0, r.ver, r.since, gwname(r.lastgw), r.lastsid, dl or -1, sess}
end

-- ensure builds the index and the session counts (record.lua, "Indexes")
-- from the records when they were not built in the shard's incarnation:
-- one pass over the device hash, in this call.
local function ensure()
  local built = IX_BUILT .. (redis.call('HGET', KEYS[4], INC) or '')
  if redis.call('ZSCORE', KEYS[8], built) then return end
  redis.call('DEL', KEYS[8])
  local all = redis.call('HGETALL', KEYS[2])
  local add, sess = {0, built}, {}
  for i = 1, #all, 2 do
    local dev, p = all[i], all[i + 1]
    if not special(dev) then
      add[#add + 1] = 0
      add[#add + 1] = IX_ID .. dev
      add[#add + 1] = 0
      add[#add + 1] = chgmember(isonline(p), headsince(p), dev)
      if isonline(p) then
        for _, ss in ipairs(decode(p, 0).sess) do sess[ss.gw] = (sess[ss.gw] or 0) + 1 end
      end
    end
  end
  mcall('ZADD', KEYS[8], add)
  local last = tonumber(redis.call('HGET', KEYS[4], '#')) or 0
  for ref = 1, last do
    if sess[ref] then
      redis.call('HSET', KEYS[4], SESS .. ref, sess[ref])
    else
      redis.call('HDEL', KEYS[4], SESS .. ref)
    end
  end
end

if ARGV[1] == 'get' then
  if special(ARGV[2]) then return {} end
  local packed = redis.call('HGET', KEYS[2], ARGV[2])
  if not packed then return {} end
  return {view(ARGV[2], packed)}
end

-- "views" returns the view of each device that has a record, in order.
if ARGV[1] == 'views' then
  local out = {}
  local devs = {}
  for i = 2, #ARGV do devs[#devs + 1] = ARGV[i] end
  if #devs == 0 then return out end
  local packed = mcall('HMGET', KEYS[2], devs)
  for i, dev in ipairs(devs) do
    if packed[i] and not special(dev) then out[#out + 1] = view(dev, packed[i]) end
  end
  return out
end

-- "keys" returns the shard's next devices in an order after a cursor key
-- (Store.List; gateway.ListRun), one run per state read: {more (1|0),
-- bound since, bound device, {since, device, ...}}. By ID ("id"), from
-- the ID index, with a state filter reading the records' flags (at most
-- 2 * limit + 64 of them); by last change ("changed"), from the
-- change index backwards, one run per state.
if ARGV[1] == 'keys' then
  ensure()
  local order, filter, prefix, asince, adev, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
  local runs = {}
  if order == 'id' then
    local lo = '[' .. IX_ID .. prefix
    if adev ~= '' and adev >= prefix then lo = '(' .. IX_ID .. adev end
    local hi = '[' .. IX_ID .. prefix .. '\255'
    local keys, more, bound = {}, 0, ''
    local budget = 2 * limit + 64
    local step = filter == '' and limit + 1 or math.min(limit * 2 + 1, 1000)
    while true do
      local ids = redis.call('ZRANGE', KEYS[8], lo, hi, 'BYLEX', 'LIMIT', 0, step)
      local on = {}
      if filter ~= '' and #ids > 0 then
        local devs = {}
        for i, m in ipairs(ids) do devs[i] = sub(m, 2) end
        local packed = mcall('HMGET', KEYS[2], devs)
        for i = 1, #ids do on[i] = packed[i] and isonline(packed[i]) end
      end
      for i, m in ipairs(ids) do
        if #keys / 2 == limit or budget == 0 then
          more = 1
          break
        end
        budget = budget - 1
        bound = sub(m, 2)
        if filter == '' or (filter == 'online') == on[i] then
          keys[#keys + 1] = 0
          keys[#keys + 1] = bound
        end
      end
      if more == 1 or #ids < step then break end
      lo = '(' .. ids[#ids]
    end
    runs[1] = {more, 0, bound, keys}
  else
    for _, st in ipairs({IX_ON, IX_OFF}) do
      if filter == '' or (filter == 'online') == (st == IX_ON) then
        local hi = '(' .. string.char(byte(st) + 1)
        if adev ~= '' then hi = '(' .. st .. struct.pack('>I6', asince) .. adev end
        local ms = redis.call('ZRANGE', KEYS[8], hi, '[' .. st, 'BYLEX', 'REV', 'LIMIT', 0, limit + 1)
        local keys, more, bsince, bdev = {}, 0, 0, ''
        for i, m in ipairs(ms) do
          if i > limit then
            more = 1
            break
          end
          bsince, bdev = struct.unpack('>I6', m, 2), sub(m, 8)
          keys[#keys + 1] = bsince
          keys[#keys + 1] = bdev
        end
        runs[#runs + 1] = {more, bsince, bdev, keys}
      end
    end
  end
  return runs
end

-- "counts" returns {online, offline, suspect}: the shard's records by
-- state, from ONLINE_COUNT (record.lua), and the online ones whose
-- deadline is after now and at most the window after it (ZCOUNT). A
-- hash without ONLINE_COUNT is counted here once, in this call (one
-- pass over the hash: a store written by an older release), and the
-- count kept from then on.
if ARGV[1] == 'counts' then
  local window, now = tonumber(ARGV[2]) or 0, clock(ARGV[3] or '')
  local suspect = 0
  if window > 0 then
    suspect = redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), string.format('%d', now + window))
  end
  local have = redis.call('HMGET', KEYS[2], ONLINE_COUNT, INC)
  local n = redis.call('HLEN', KEYS[2])
  if have[2] then n = n - 1 end
  local on = tonumber(have[1])
  if on then return {on, n - 1 - on, suspect} end
  on = 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    if not special(all[i]) and isonline(all[i + 1]) then on = on + 1 end
  end
  redis.call('HSET', KEYS[2], ONLINE_COUNT, on)
  return {on, n - on, suspect}
end

-- "gateways" returns, per gateway the shard has heard (record.lua,
-- "Gateway liveness"), a flat list of name, newest epoch, contact ms (-1
-- for none), behind (1|0), lost (1|0: the marker the reap keeps on shard
-- 0 while it reports the gateway lost), its live sessions in the shard
-- (record.lua, "Indexes").
if ARGV[1] == 'gateways' then
  ensure()
  local last = tonumber(redis.call('HGET', KEYS[4], '#')) or 0
  local out = {}
  if last == 0 then return out end
  local fields = {}
  for ref = 1, last do
    fields[#fields + 1] = '#' .. ref
    fields[#fields + 1] = LIVE .. ref
    fields[#fields + 1] = LOST .. ref
    fields[#fields + 1] = SESS .. ref
  end
  local v = mcall('HMGET', KEYS[4], fields)
  for ref = 1, last do
    local name, live, lost, held = v[4 * ref - 3], v[4 * ref - 2], v[4 * ref - 1], v[4 * ref]
    if name then
      local at, behind = string.match(live or '', '^(%d+) (%d)')
      out[#out + 1] = name
      out[#out + 1] = redis.call('HGET', KEYS[4], name) or '0'
      out[#out + 1] = at or '-1'
      out[#out + 1] = behind == '1' and 1 or 0
      out[#out + 1] = lost and 1 or 0
      out[#out + 1] = tonumber(held) or 0
    end
  end
  return out
end

local cursor, skip, limit, count = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local encoding = redis.call('OBJECT', 'ENCODING', KEYS[2])
local listpack = encoding == 'listpack' or encoding == 'ziplist'
if cursor == LISTPACK then
  cursor = '0'
  if not listpack then skip = 0 end
end
local out = {'0', 0}
for _ = 1, 16 do
  local res = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', count)
  local items = res[2]
  local n = #items / 2
  for j = skip + 1, n do
    if not special(items[2 * j - 1]) then
      out[#out + 1] = view(items[2 * j - 1], items[2 * j])
      if #out - 2 == limit then
        if j < n then
          out[1], out[2] = cursor, j
          if listpack then out[1] = LISTPACK end
        else
          out[1] = res[1]
        end
        return out
      end
    end
  end
  cursor, skip = res[1], 0
  if cursor == '0' then return out end
end
out[1] = cursor
return out
