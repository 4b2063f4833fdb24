-- Apply one batch of writes of one shard, atomically (Store.Apply).
-- KEYS: exp, dev, events, epochs (record.lua).
-- ARGV: gw, epoch, lease ms, replay (1|0), now ms or "", events maxlen,
--       then per write: device, session, kind (1 connect, 2 renew, 3 leave), age ms.
-- Returns {0, newest epoch} when fenced (nothing applied), else {1, events...}.
local gw, epoch, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local replay, now, maxlen = ARGV[4] == '1', clock(ARGV[5]), ARGV[6]
local nowstr = string.format('%d', now)

local seen = redis.call('HMGET', KEYS[4], gw, '@' .. gw)
if seen[1] and tonumber(seen[1]) > epoch then return {0, seen[1]} end
if seen[1] ~= ARGV[2] then redis.call('HSET', KEYS[4], gw, ARGV[2]) end
local gwref = tonumber(seen[2])
if not gwref then
  gwref = redis.call('HINCRBY', KEYS[4], '#', 1)
  redis.call('HSET', KEYS[4], '@' .. gw, gwref, '#' .. gwref, gw)
end
gwnames[gwref] = gw
-- A batch without writes only records the epoch (the uplink announces a
-- new process on every shard so that older epochs are fenced everywhere).
if #ARGV < 7 then return {1} end

-- Load every device of the batch once. Device k (idx[dev] = k) has its
-- packed record packed[k], its deadline z[k] (false when it has none) and,
-- once decoded, its record rec[k]; dirty[k] and moved[k] say that the
-- record and the deadline must be written back.
local idx, devs = {}, {}
for i = 7, #ARGV, 4 do
  local d = ARGV[i]
  if not idx[d] then
    devs[#devs + 1] = d
    idx[d] = #devs
  end
end
local packed = mcall('HMGET', KEYS[2], devs)
local scores = mcall('ZMSCORE', KEYS[1], devs)
local z, rec, dirty, moved = {}, {}, {}, {}
for k = 1, #devs do z[k] = tonumber(scores[k]) or false end
local function setz(k, v)
  if z[k] ~= v then z[k], moved[k] = v, true end
end

-- The steady state is a renewal of a device's only session by the gateway
-- that wrote it last: its record is 7 (online, last = session 0, one
-- session), ver, since, 0, then tails[sid] below, and the renewal moves
-- the device deadline only, leaving the record as it is.
local tailhead = uvarint(gwref) .. uvarint(epoch) .. char(0)
local tails = {}
local function renewsonly(p, sid)
  if byte(p, 1) ~= 7 then return false end
  local i = 2
  while byte(p, i) >= 128 do i = i + 1 end
  i = i + 7
  if byte(p, i) ~= 0 then return false end
  local tail = tails[sid]
  if not tail then
    tail = tailhead .. wsid(sid, gwref, epoch)
    tails[sid] = tail
  end
  return #p == i + #tail and find(p, tail, i + 1, true) == i + 1
end

local events = {1}
local function event(...) events[#events + 1] = emit(...) end

for i = 7, #ARGV, 4 do
  local dev, sid, kind = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local d = now - tonumber(ARGV[i + 3]) + lease
  local k = idx[dev]
  local zk = z[k]
  if kind ~= '3' and d > now and zk and zk > now and not rec[k] and packed[k] and renewsonly(packed[k], sid) then
    if d > zk then z[k], moved[k] = d, true end
  else
    -- zk is the deadline of the record as loaded or as renewed above.
    local r = rec[k]
    if not r and packed[k] then
      r = decode(packed[k], zk)
      rec[k] = r
    end
    if r and r.on and dropexpired(r, now) then
      dirty[k] = true
      setz(k, maxdl(r))
      if not z[k] then
        r.on, r.ver, r.since = false, r.ver + 1, now
        event(dev, 'offline', r.ver, nowstr, 'expired', gwname(r.lastgw), r.lastsid, zk)
      end
    end
    local ss, at
    if r then
      for j, x in ipairs(r.sess) do
        if x.sid == sid then ss, at = x, j break end
      end
    end
    if kind ~= '3' then
      if d > now then
        if not r then
          r = {on = false, ver = 0, since = now, sess = {}}
          rec[k] = r
        end
        if not ss then
          r.sess[#r.sess + 1] = {gw = gwref, ep = epoch, dl = d, sid = sid}
          dirty[k] = true
        else
          if d > ss.dl then
            ss.dl = d
            -- other sessions store offsets from the device deadline
            if #r.sess > 1 then dirty[k] = true end
          end
          if ss.gw ~= gwref or ss.ep ~= epoch then
            ss.gw, ss.ep, dirty[k] = gwref, epoch, true
          end
        end
        if r.lastgw ~= gwref or r.lastsid ~= sid then
          r.lastgw, r.lastsid, dirty[k] = gwref, sid, true
        end
        setz(k, maxdl(r))
        if not r.on then
          r.on, r.ver, r.since, dirty[k] = true, r.ver + 1, now, true
          local reason = 'renew'
          if replay then reason = 'replay' elseif kind == '1' then reason = 'connect' end
          event(dev, 'online', r.ver, nowstr, reason, gw, sid)
        end
      end
    elseif ss and ss.dl <= d then
      table.remove(r.sess, at)
      r.lastgw, r.lastsid, dirty[k] = gwref, sid, true
      setz(k, maxdl(r))
      if not z[k] then
        r.on, r.ver, r.since = false, r.ver + 1, now
        event(dev, 'offline', r.ver, nowstr, 'leave', gw, sid)
      end
    end
  end
end

local hset, zadd, zrem = {}, {}, {}
for k, dev in ipairs(devs) do
  if dirty[k] then
    hset[#hset + 1] = dev
    hset[#hset + 1] = encode(rec[k])
  end
  if moved[k] then
    if z[k] then
      zadd[#zadd + 1] = z[k]
      zadd[#zadd + 1] = dev
    else
      zrem[#zrem + 1] = dev
    end
  end
end
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
trim(maxlen)
return events
