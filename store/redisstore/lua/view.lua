-- Read devices of one shard for Store.Device and Store.List.
-- KEYS: exp, dev, events, epochs, inv, held, gateways (record.lua; only exp,
-- dev and epochs are used here).
-- ARGV: "get", device
--    or "scan", HSCAN cursor, items of that cursor's step already returned,
--       limit, state filter ("online", "offline" or ""), HSCAN COUNT (the
--       same on every call, so that a step at a cursor holds the same items)
--    or "counts"
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

if ARGV[1] == 'get' then
  if special(ARGV[2]) then return {} end
  local packed = redis.call('HGET', KEYS[2], ARGV[2])
  if not packed then return {} end
  return {view(ARGV[2], packed)}
end

-- "counts" returns {online, offline}: the shard's records by state, from
-- ONLINE_COUNT (record.lua). A hash without it is counted here once, in
-- this call (one pass over the hash: a store written by an older
-- release), and the count kept from then on.
if ARGV[1] == 'counts' then
  local have = redis.call('HMGET', KEYS[2], ONLINE_COUNT, INC)
  local n = redis.call('HLEN', KEYS[2])
  if have[2] then n = n - 1 end
  local on = tonumber(have[1])
  if on then return {on, n - 1 - on} end
  on = 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    if not special(all[i]) and isonline(all[i + 1]) then on = on + 1 end
  end
  redis.call('HSET', KEYS[2], ONLINE_COUNT, on)
  return {on, n - on}
end

-- "gateways" returns, per gateway the shard has heard (record.lua,
-- "Gateway liveness"), a flat list of name, newest epoch, contact ms (-1
-- for none), behind (1|0), lost (1|0: the marker the reap keeps on shard
-- 0 while it reports the gateway lost).
if ARGV[1] == 'gateways' then
  local last = tonumber(redis.call('HGET', KEYS[4], '#')) or 0
  local out = {}
  if last == 0 then return out end
  local fields = {}
  for ref = 1, last do
    fields[#fields + 1] = '#' .. ref
    fields[#fields + 1] = LIVE .. ref
    fields[#fields + 1] = LOST .. ref
  end
  local v = mcall('HMGET', KEYS[4], fields)
  for ref = 1, last do
    local name, live, lost = v[3 * ref - 2], v[3 * ref - 1], v[3 * ref]
    if name then
      local at, behind = string.match(live or '', '^(%d+) (%d)')
      out[#out + 1] = name
      out[#out + 1] = redis.call('HGET', KEYS[4], name) or '0'
      out[#out + 1] = at or '-1'
      out[#out + 1] = behind == '1' and 1 or 0
      out[#out + 1] = lost and 1 or 0
    end
  end
  return out
end

local cursor, skip, limit, filter, count = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
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
    local packed = items[2 * j]
    local on = isonline(packed)
    if not special(items[2 * j - 1]) and (filter == '' or (filter == 'online') == on) then
      out[#out + 1] = view(items[2 * j - 1], packed)
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
