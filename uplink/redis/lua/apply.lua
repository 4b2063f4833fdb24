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

-- Load every device of the batch once; records are decoded on demand.
local devs, st = {}, {}
for i = 7, #ARGV, 4 do
  local d = ARGV[i]
  if not st[d] then
    st[d] = true
    devs[#devs + 1] = d
  end
end
local packed = mcall('HMGET', KEYS[2], devs)
local scores = mcall('ZMSCORE', KEYS[1], devs)
for k, d in ipairs(devs) do
  local z = tonumber(scores[k]) or false
  st[d] = {p = packed[k], z0 = z, z = z}
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
local function event(...) events[#events + 1] = emit(maxlen, ...) end

for i = 7, #ARGV, 4 do
  local dev, sid, kind = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local d = now - tonumber(ARGV[i + 3]) + lease
  local s = st[dev]
  if kind ~= '3' and d > now and s.p and not s.r and s.z and s.z > now and renewsonly(s.p, sid) then
    if d > s.z then s.z = d end
  else
    -- s.z is the deadline of the record as loaded or as renewed above.
    if s.p and not s.r then s.r = decode(s.p, s.z) end
    local r = s.r
    if r and r.on and dropexpired(r, now) then
      s.dirty = true
      s.z = maxdl(r)
      if not s.z then
        r.on, r.ver, r.since = false, r.ver + 1, now
        event(dev, 'offline', r.ver, nowstr, 'expired', gwname(r.lastgw), r.lastsid, s.z0)
      end
    end
    local ss, idx
    if r then
      for k, x in ipairs(r.sess) do
        if x.sid == sid then ss, idx = x, k break end
      end
    end
    if kind ~= '3' then
      if d > now then
        if not r then
          r = {on = false, ver = 0, since = now, sess = {}}
          s.r = r
        end
        if not ss then
          r.sess[#r.sess + 1] = {gw = gwref, ep = epoch, dl = d, sid = sid}
          s.dirty = true
        else
          if d > ss.dl then
            ss.dl = d
            -- other sessions store offsets from the device deadline
            if #r.sess > 1 then s.dirty = true end
          end
          if ss.gw ~= gwref or ss.ep ~= epoch then
            ss.gw, ss.ep, s.dirty = gwref, epoch, true
          end
        end
        if r.lastgw ~= gwref or r.lastsid ~= sid then
          r.lastgw, r.lastsid, s.dirty = gwref, sid, true
        end
        s.z = maxdl(r)
        if not r.on then
          r.on, r.ver, r.since, s.dirty = true, r.ver + 1, now, true
          local reason = 'renew'
          if replay then reason = 'replay' elseif kind == '1' then reason = 'connect' end
          event(dev, 'online', r.ver, nowstr, reason, gw, sid)
        end
      end
    elseif ss and ss.dl <= d then
      table.remove(r.sess, idx)
      r.lastgw, r.lastsid, s.dirty = gwref, sid, true
      s.z = maxdl(r)
      if not s.z then
        r.on, r.ver, r.since = false, r.ver + 1, now
        event(dev, 'offline', r.ver, nowstr, 'leave', gw, sid)
      end
    end
  end
end

local hset, zadd, zrem = {}, {}, {}
for _, dev in ipairs(devs) do
  local s = st[dev]
  if s.dirty then
    hset[#hset + 1] = dev
    hset[#hset + 1] = encode(s.r)
  end
  if s.z ~= s.z0 then
    if s.z then
      zadd[#zadd + 1] = s.z
      zadd[#zadd + 1] = dev
    else
      zrem[#zrem + 1] = dev
    end
  end
end
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
return events
