-- Reap at most limit due entries of one shard, atomically (Store.Reap).
-- KEYS: exp, dev, events, epochs, inv, held, gateways, idx (record.lua).
-- ARGV, built by Store.Reap in this order (the R_ positions):
--   limit, now ms or "", events maxlen, the gateway grace ms (0: no
-- holds), the longest silence of a live gateway ms, and the store time
-- since which a gateway must have been heard to count as live (ms; the
-- end of the caller's last outage, 0 for none, "now" while it cannot
-- tell: no gateway counts as live), and the store time after which the
-- call is stale ("" for none): a call its caller gave up on (a timeout
-- while the server was paused) may still run when the server resumes,
-- and must then do nothing; it returns {-1, now}; and how long a gateway
-- may go unheard before it is reported lost (ms; 0: no gateway events,
-- the caller passes it for shard 0 only), how soon a held device of a
-- gateway that is heard is looked at again (ms: about a flush interval,
-- the time that gateway's coverage takes to move on), and how long after
-- its last call a gateway's coverage still holds every due device back
-- (ms: lease + gateway grace; evidence it holds can be late but valid
-- until then), the longest gap in the shard's reaps that is not an
-- outage (ms; 0: none, below), and the incarnation the caller's last reap
-- of the shard saw ("" for none).
-- Returns one flat array:
--   {trimmed, more (1|0), next deadline or -1, orphans, now, held,
--    incarnation, gap (1|0: this call found a gap in the reaps, below),
--    then per offline event: id, device, ver, gw, session,
--    deadline, reason}
-- Every reap event is state offline at now, so those are not repeated per
-- event (the Go side fills them in); deadline is the device's true lease
-- end; reason is expired, or gateway_lost at the end of a hold whose
-- gateway's coverage still has not reached it. orphans counts due entries without an
-- online record (removed, no event); held the devices held this call
-- (record.lua, "Held devices").
local R_LIMIT, R_NOW, R_MAXLEN, R_GRACE, R_SILENCE, R_SINCE, R_NOTAFTER, R_LOSTAFTER, R_RECHECK, R_HORIZON, R_GAP, R_SEEN = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
local limit, now, maxlen = tonumber(ARGV[R_LIMIT]), clock(ARGV[R_NOW]), ARGV[R_MAXLEN]
local grace, silence = tonumber(ARGV[R_GRACE]) or 0, tonumber(ARGV[R_SILENCE]) or 0
local since, nosince = tonumber(ARGV[R_SINCE]) or 0, ARGV[R_SINCE] == 'now'
if nosince then since = now + 1 end
local notafter = tonumber(ARGV[R_NOTAFTER])
if notafter and now > notafter then return {-1, now} end
local lostafter = tonumber(ARGV[R_LOSTAFTER]) or 0
local recheck = tonumber(ARGV[R_RECHECK]) or 1000
local horizon = tonumber(ARGV[R_HORIZON]) or 0
local nowstr, nowpacked = string.format('%d', now), struct.pack('>I6', now)
local rcall, evkey = redis.call, KEYS[3]

-- A gap in the reaps (record.lua, "Gaps"): this call cannot tell whether
-- the gateways run again, so it judges none (every due device their
-- coverage has not reached is held, its grace counted from now); later
-- calls count a gateway as live once heard after the gap.
local pulse = rcall('HMGET', KEYS[4], REAPED, GAPEND)
local lastreap, gapend = tonumber(pulse[1]), tonumber(pulse[2]) or 0
local maxgap = tonumber(ARGV[R_GAP]) or 0
local gap = maxgap > 0 and lastreap ~= nil and now - lastreap > maxgap
if gap then
  rcall('HSET', KEYS[4], REAPED, nowstr, GAPEND, nowstr)
  nosince, since = true, now + 1
else
  if maxgap > 0 and (not lastreap or now > lastreap) then rcall('HSET', KEYS[4], REAPED, nowstr) end
  since = math.max(since, gapend)
end
local incs = rcall('HMGET', KEYS[4], INC, REPL, CHANGED)
local inc = incarnation(incs[1], rcall('HGET', KEYS[2], INC), incs[2], now, ARGV[R_NOW] ~= '')
-- changed: the shard had another incarnation before this one (record.lua,
-- CHANGED), as a gateway reports it (apply.lua) or the caller's reaps saw
-- (R_SEEN): a reap may run before any gateway reports it (their calls
-- still fail, or a restarted gateway process has no incarnation to
-- compare)
local changed = incs[3] ~= false
if not changed and ARGV[R_SEEN] ~= '' and ARGV[R_SEEN] ~= inc then
  rcall('HSET', KEYS[4], CHANGED, nowstr)
  changed = true
end
-- fresh: the incarnation began less than the grace ago, and it is not a
-- new store's first: a loss, a restart, a failover. The gateways may not
-- have restored what they hold: a lost state knows none of them, and a
-- replaced one only those of its time (a restart into a snapshot minutes
-- old)
local fresh = changed and now < incsince + grace

-- offline turns the record of a device whose only session ran out (the
-- common due entry) into its offline record straight from the packed
-- bytes; it returns nil for other records, which take the general path.
-- Returns the new record, its ver, the gateway ref and the session id.
local function offline(p)
  local i = steadyref(p)
  if not i then return nil end
  -- a record last changed before this incarnation may need a ver jump
  -- (nextver): the general path (since ends the head, before the index 0)
  if struct.unpack('>I6', p, i - 1 - SINCE_LEN) < incsince then return nil end
  local ver = ruvarint(p, 2)
  local gw, ep, sid
  gw, i = ruvarint(p, i)
  ep, i = ruvarint(p, i)
  -- the only session's offset from the device deadline is 0: one byte
  sid, i = rsid(p, i + 1, gw, ep)
  if i <= #p then return nil end
  ver = ver + 1
  -- flags 0 (offline, last given as a gateway ref and a literal sid, no
  -- session), ver, since, last
  return char(0) .. uvarint(ver) .. nowpacked .. uvarint(gw) .. uvarint(#sid * 2) .. sid, ver, gw, sid
end

-- Gateway events: every gateway writes to every shard at least every
-- keep-alive, so shard 0's liveness records tell of all of them. A gateway
-- not heard for lostafter (counted from the end of the caller's last
-- outage, or the start of this incarnation, when that is later: the
-- runner's own outage is not the gateway's) gets one `lost` event in
-- KEYS[7], and one `back` event when it writes again. While the caller cannot tell when its outage ended
-- ("now"), no gateway is judged.
local gwevents = 0
if lostafter > 0 and not nosince then
  local last = tonumber(rcall('HGET', KEYS[4], '#')) or 0
  if last > 0 then
    local fields = {}
    for ref = 1, last do
      fields[#fields + 1] = LIVE .. ref
      fields[#fields + 1] = LOST .. ref
    end
    local v = mcall('HMGET', KEYS[4], fields)
    for ref = 1, last do
      local s, lostat = v[2 * ref - 1], tonumber(v[2 * ref])
      local at = s and tonumber(string.match(s, '^(%d+)'))
      if at then
        -- (a record from before this incarnation counts from its start:
        -- its time is a replaced state's, not the gateway's last call)
        local silent = now - math.max(at, since, incsince) > lostafter
        local state
        if silent and not lostat then
          state = 'lost'
          rcall('HSET', KEYS[4], LOST .. ref, at)
        elseif lostat and at > lostat then
          state = 'back'
          rcall('HDEL', KEYS[4], LOST .. ref)
        end
        if state then
          rcall('XADD', KEYS[7], 'MAXLEN', '~', maxlen, '*', 'gateway', gwname(ref), 'state', state,
            'at', nowstr, 'contact', string.format('%d', at))
          gatewayevent(ref, state, now, at)
          gwevents = gwevents + 1
        end
      end
    end
  end
end

local due = {}
if limit > 0 then
  due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
end
local devs = {}
for i = 1, #due, 2 do devs[#devs + 1] = due[i] end
local packed, heldv = {}, {}
if #devs > 0 then
  packed = mcall('HMGET', KEYS[2], devs)
  if rcall('EXISTS', KEYS[6]) == 1 then heldv = mcall('HMGET', KEYS[6], devs) end
end

-- gateway is what the reap needs of gateway ref's liveness record:
-- heard, whether it was heard on this shard within the silence and since
-- the last outage; recent, whether within the horizon; behind; cov, its
-- coverage (nil when it reports none); before, whether it has not
-- restored in this incarnation: not heard since it began, or heard only
-- in calls that cover nothing here (coverage 0: apply.lua's unrestored,
-- until its restore reports coverage again), so that it may hold what
-- the state lacks.
-- covers says whether it has covered a session deadline dl: its coverage
-- has reached dl, or, for a gateway that reports no coverage (an older
-- release), it is heard and not behind (record.lua, "Gateway liveness").
local gws = {}
local function gateway(ref)
  local g = gws[ref]
  if not g then
    local at, behind, cov = liveness(ref)
    g = {at = at, heard = at ~= nil and at >= since and now - at <= silence, recent = withinhorizon(ref, at, now, horizon),
      behind = behind, cov = cov, before = at ~= nil and (at < incsince or cov == 0)}
    gws[ref] = g
  end
  return g
end
local function covers(ref, dl)
  local g = gateway(ref)
  if g.cov then return g.cov >= dl end
  return g.heard and not g.behind
end

-- laggard is the gateway of the shard heard within the horizon with the
-- least coverage (nil when none reports coverage), read once per call: a
-- device may have moved to it (a CoAP session is named by the device, not
-- the gateway), so its evidence of any device may still be on its way,
-- even while the store does not hear it (a cut link, a hung shard).
local laggard
local function slowest()
  if laggard == nil then
    laggard = false
    local last = tonumber(redis.call('HGET', KEYS[4], '#')) or 0
    for ref = 1, last do
      local g = gateway(ref)
      if g.recent and g.cov and (not laggard or g.cov < gateway(laggard).cov) then laggard = ref end
    end
  end
  return laggard
end

-- waitfor is the gateway ref a due online record must wait for, or nil,
-- and whether it is the gateway of one of the device's sessions: the
-- gateway of a session that ran out (they all have, or the device would
-- not be due) before that gateway's coverage reached it, or else a
-- gateway heard within the horizon whose coverage has not reached the
-- device's deadline. truedl
-- is the device's true deadline (the sessions' offsets count from it).
local function waitfor(p, truedl)
  local g = owner(p)
  if g then
    if not covers(g, truedl) then return g, true end
  else
    for _, ss in ipairs(decode(p, truedl).sess) do
      if ss.dl <= now and not covers(ss.gw, ss.dl) then return ss.gw, true end
    end
  end
  local l = slowest()
  if l and gateway(l).cov < truedl then return l, false end
  return nil, false
end

-- out[1..8] are filled in at the end; n is the last index used.
local header = 8
local out, n = {0, 0, -1, 0, now, 0, '', 0}, header
local trimmed, orphans, nheld = 0, 0, 0
local hset, zadd, zrem, hold, unhold = {}, {}, {}, {}, {}
for k, dev in ipairs(devs) do
  local p, old = packed[k], due[2 * k]
  -- truedl is the lease end that ran out (the index entry, or the true
  -- deadline of a device this reap held); ending says its grace is over
  local truedl, washeld = tonumber(old), false
  if heldv[k] then
    local t, u = heldfields(heldv[k])
    if u == truedl then truedl, washeld = t, true end
    unhold[#unhold + 1] = dev
  end
  -- the grace counts from the deadline, or from the end of the caller's
  -- last outage when that is later: the gateways replay once the store
  -- answers (as a gateway's loss counts, above)
  local from = math.max(truedl, nosince and now or since)
  local rec, ver, gw, sid, reason = nil, nil, nil, nil, 'expired'
  local held = false
  if p and isonline(p) and (grace > 0 or washeld) then
    local g, own = waitfor(p, truedl)
    -- a deadline from before this incarnation (a replaced state's
    -- records may hold deadlines long passed), or a gateway not heard
    -- since before it: the grace counts from the incarnation's start, as
    -- from the end of an outage (the gateways restore what they hold once
    -- they call)
    if g and (truedl < incsince or gateway(g).before) then from = math.max(from, incsince) end
    -- the wait lasts the grace; for a held leave (its session ends at
    -- the leave's time, not a lease after the last evidence) waiting for
    -- another gateway than the device's own (it may have moved there, its
    -- connect held up by that gateway's outage), up to lease + grace:
    -- that gateway's horizon
    local span = grace
    if g and not own and not fresh then
      local r = decode(p, truedl)
      for _, x in ipairs(r.sess) do
        if leftat(r, x) then span = math.max(grace, horizon) break end
      end
    end
    local endat = from + span
    -- a gateway not heard since the incarnation began is waited for as
    -- one heard at its start: to its horizon (lease + grace) from then at
    -- least, looked at again each silence (a gateway stopped as the store
    -- came back)
    if g and gateway(g).before then endat = math.max(endat, incsince + horizon) end
    local ending = washeld and tonumber(old) >= endat
    if (g or fresh) and ending then
      -- the grace is over: the device goes, lost with its gateway when
      -- one of its own did not cover it
      if own then reason = 'gateway_lost' end
    elseif g or fresh then
      -- hold: the index entry moves, the record stays; to a recheck
      -- while the gateway waited for is heard, to the end of the grace
      -- (or of another gateway's horizon) while it is not. In an
      -- incarnation younger than the grace (fresh), every due device is
      -- held to the end of the grace counted from its start, then judged
      -- as usual: the gateways may not have restored what they hold yet
      -- (a device that moved may come back through another's restore of
      -- a session that ran out there), and the state may not know them
      -- (a loss took their liveness records; a snapshot minutes old holds
      -- those of its time)
      local untildl = endat
      if fresh then
        untildl = incsince + grace
      elseif g then
        local gg = gateway(g)
        if gg.heard then
          untildl = math.min(now + recheck, untildl)
        elseif gg.before then
          -- looked at again each silence: it calls once it learns of
          -- the new incarnation, and is judged as usual from then on
          untildl = math.min(now + math.max(silence, recheck), untildl)
        elseif not own then
          -- to its horizon, looked at again each silence (it may be
          -- heard again, and covered, before that)
          untildl = math.min(gg.at + horizon + 1, untildl)
          if silence > 0 then untildl = math.min(now + silence, untildl) end
        end
      end
      zadd[#zadd + 1] = untildl
      zadd[#zadd + 1] = dev
      hold[#hold + 1] = dev
      hold[#hold + 1] = string.format('%d %d', truedl, untildl)
      nheld = nheld + 1
      held = true
    end
  end
  truedl = string.format('%d', truedl)
  if p and not held then rec, ver, gw, sid = offline(p) end
  if rec then
    -- a steady record's only session went: the record is offline since now
    reindex(dev, p, false, now)
    movesess(gw, -1)
  end
  if not rec and not held then
    -- (a held device's sessions count from its true deadline, not from
    -- the index entry the hold moved)
    local r = p and decode(p, washeld and tonumber(truedl) or tonumber(old))
    if not r or not r.on then
      orphans = orphans + 1
      zrem[#zrem + 1] = dev
    else
      local was = sessgws(r)
      local gone = dropexpired(r, now)
      local dl = maxdl(r)
      if dl then
        trimmed = trimmed + 1
        zadd[#zadd + 1] = dl
        zadd[#zadd + 1] = dev
      else
        r.on, r.ver, r.since = false, nextver(r, now), now
        ver = r.ver
        if gone then gw, sid = gone.gw, gone.sid else gw, sid = r.lastgw, r.lastsid end
        -- a last session kept past its leave (apply.lua): a leave
        if gone and reason == 'expired' and leftat(r, gone) then reason = 'leave' end
      end
      reindex(dev, p, r.on, r.since)
      movesessions(was, r)
      hset[#hset + 1] = dev
      hset[#hset + 1] = encode(r)
    end
  elseif rec then
    hset[#hset + 1] = dev
    hset[#hset + 1] = rec
  end
  if ver then
    -- the offline event, as emit (record.lua) writes it
    local gwn = gwname(gw)
    local id = rcall('XADD', evkey, '*',
      'device', dev, 'state', 'offline', 'ver', ver, 'at', nowstr, 'reason', reason,
      'gw', gwn, 'session', sid, 'deadline', truedl)
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6], out[n + 7] = id, dev, ver, gwn, sid, truedl, reason
    n = n + 7
    zrem[#zrem + 1] = dev
  end
end
emitted = emitted + (n - header) / 7
-- every offline event of a reap turned an online record offline (Counts)
countonline(-(n - header) / 7)
if #unhold > 0 then mcall('HDEL', KEYS[6], unhold) end
if #hold > 0 then mcall('HSET', KEYS[6], hold) end
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
ixflush()
-- Invalidations older than an hour are of no use (a gateway uses a belief
-- for ten minutes at most, record.lua "Beliefs"): forget those of one
-- gateway ref per call, the refs in turn ("~r" in the epochs hash). In
-- the steady state there are none, and the call writes nothing for this.
local refs = rcall('ZCARD', KEYS[5]) > 0 and rcall('HMGET', KEYS[4], '#', '~r') or {}
local last = tonumber(refs[1])
if last then
  local r = (tonumber(refs[2]) or 0) % last + 1
  rcall('HSET', KEYS[4], '~r', r)
  rcall('ZREMRANGEBYLEX', KEYS[5], '[' .. r .. ':', '(' .. invalidation(r, now - 3600000, ''))
end

trim(maxlen)
local first = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local more, nextdl = 0, -1
if #first > 0 then
  nextdl = tonumber(first[2])
  if nextdl <= now then more = 1 end
end
out[1], out[2], out[3], out[4], out[6] = trimmed, more, nextdl, orphans, nheld
-- the shard's incarnation, as apply.lua reports it
out[7] = inc
if gap then out[8] = 1 end
return out
