-- Apply one batch of writes of one shard, atomically (Store.Apply).
-- KEYS: exp, dev, events, epochs, inv, held, gateways, idx (record.lua).
-- ARGV, built by Store.applyArgs in this order (the A_ positions):
--   gw, epoch, lease ms, replay (1 replay, 2 restore, 0 neither: see
--   gateway.Batch), now ms or "", events maxlen,
--   the incarnation the caller's beliefs were learned in ("" for none),
--   the number F of believed renewals, the batch order (one byte per
--   write, BELIEVED for a believed renewal, "0" for another write; ""
--   when F is 0), the believed renewals' sessions joined by "\n", their
--   ages (ms, 4 bytes big-endian each), their devices joined by "\n",
--   whether the gateway is behind (1: its outbox still holds writes),
--   the store time after which the call is stale ("" for none: a call the
--   caller gave up on may still run when a paused server resumes, with
--   ages that are no longer true; it then does nothing), the gateway
--   grace ms (late evidence of the writes below may be that late; and the
--   grace after a new incarnation), the store time the oldest belief the
--   believed renewals stand on was learned at ("" when F is 0; beliefs
--   older than BELIEF_TTL on the store clock are not used: the reap keeps
--   invalidations for an hour on the same clock), the incarnation of the
--   caller's last successful call ("" for none: a new process, or a
--   caller without beliefs), the store time of the gateway's coverage
--   (gateway.Batch.Covers; "" for none), the writes the grace applies
--   to ("" for every write: a replay; "-" for none; else one byte per
--   write in batch order, "1" for a coalesced write:
--   gateway.Write.Coalesced), the gateway horizon
--   ms (how long after its last call another gateway's coverage holds a
--   leave back, below; 0: none), the store time the call was sent at as
--   the caller estimates it from earlier replies, a lower bound ("" for
--   none: the writes' ages then count from now), the longest gap in the
--   shard's reaps that is not an outage (ms; 0: none; record.lua, "Gaps"),
--   how much later than the call dates it (A_SENTAT less the age) the
--   caller's evidence may have been observed on the store's clock (ms;
--   "" for 0: the width of the caller's estimate, Store.skew; below, a
--   leave), then from A_WRITES the other writes, W_ARGS arguments each: device,
--   session, kind (1 connect, 2 renew, 3 leave), age ms, lease ms (the
--   write's own: the lease in force when its evidence was observed;
--   believed renewals use the batch's lease).
-- Returns {0, newest epoch} when fenced (nothing applied), {-1, now}
-- when stale (nothing applied), else {1, incarnation, status, now,
-- events...}: status is a flat list of
-- device, session pairs, the session the caller may believe steady from
-- now on, or "" where it must drop its belief (record.lua, "Beliefs").
local A_GW, A_EPOCH, A_LEASE, A_REPLAY, A_NOW, A_MAXLEN = 1, 2, 3, 4, 5, 6
local A_INC, A_NFAST, A_ORDER, A_FASTSIDS, A_FASTAGES, A_FASTDEVS = 7, 8, 9, 10, 11, 12
local A_BEHIND, A_NOTAFTER, A_GRACE, A_BELIEFAT, A_SEEN, A_COVERED = 13, 14, 15, 16, 17, 18
local A_GRACED, A_HORIZON, A_SENTAT, A_GAP, A_SKEW, A_WRITES = 19, 20, 21, 22, 23, 24
local BELIEF_TTL = 600000
local W_ARGS = 5
local BELIEVED = byte('1')
local KIND_CONNECT, KIND_RENEW, KIND_LEAVE = '1', '2', '3'

local gw, epoch, lease = ARGV[A_GW], tonumber(ARGV[A_EPOCH]), tonumber(ARGV[A_LEASE])
local replay, restore = ARGV[A_REPLAY] == '1', ARGV[A_REPLAY] == '2'
-- resent: the call is a restore batch (gateway.Batch.Restore), whose
-- leaves re-send leaves the store accepted before a loss; restore also
-- holds for the caller's first call after one (unrestored, below)
local resent = restore
local now, maxlen = clock(ARGV[A_NOW]), ARGV[A_MAXLEN]
local replaygrace, graced = tonumber(ARGV[A_GRACE]) or 0, ARGV[A_GRACED]
local horizon = tonumber(ARGV[A_HORIZON]) or 0
local GRACED = byte('1')
local nowstr = string.format('%d', now)
if tonumber(ARGV[A_NOTAFTER]) and now > tonumber(ARGV[A_NOTAFTER]) then return {-1, now} end
-- gapfrom: the end of the last gap in the shard's reaps, or now while
-- one is under way (record.lua, "Gaps"); nil when the caller looks for
-- none. gaplate says whether evidence observed at obs of a session that
-- ran out at dl is late but valid by it.
local gapfrom
if (tonumber(ARGV[A_GAP]) or 0) > 0 then
  local p = redis.call('HMGET', KEYS[4], REAPED, GAPEND)
  local lastreap = tonumber(p[1])
  if lastreap and now - lastreap > tonumber(ARGV[A_GAP]) then gapfrom = now else gapfrom = tonumber(p[2]) end
end
local function gaplate(dl, obs)
  return gapfrom ~= nil and dl <= gapfrom and obs <= gapfrom + replaygrace
end
-- evnow is the time the writes' ages count from: when the call was sent,
-- as the caller estimates the store's clock (a lower bound), when that is
-- earlier than now. A call its gateway sent late in a starved process, or
-- that a starved server ran late (at most until notafter), would
-- otherwise date its evidence that much later than it was observed: a
-- device's connect to that gateway after its goodbye to another, where
-- the device connected first. Coverage (A_COVERED) is on the same clock.
local evnow = math.min(now, tonumber(ARGV[A_SENTAT]) or now)
-- skew: how much later than that (less its age) the caller's evidence
-- may have been observed (A_SKEW). Another gateway dates its evidence on
-- its own estimate, so a move made before break (a connect there, then
-- the goodbye here) may be dated in either order by up to that much: a
-- leave counts as observed as late as it may have been (general's lobs)
-- wherever another gateway's coverage or evidence is held against it.
local skew = tonumber(ARGV[A_SKEW]) or 0

local seen = redis.call('HMGET', KEYS[4], gw, '@' .. gw, INC, REPL)
if seen[1] and tonumber(seen[1]) > epoch then return {0, seen[1]} end
local gwref = tonumber(seen[2])
if not gwref then
  gwref = redis.call('HINCRBY', KEYS[4], '#', 1)
  redis.call('HSET', KEYS[4], '@' .. gw, gwref, '#' .. gwref, gw)
end
gwnames[gwref] = gw
local invlo, invhi = '[' .. gwref .. ':', '[' .. gwref .. ';'
if seen[1] ~= ARGV[A_EPOCH] then
  redis.call('HSET', KEYS[4], gw, ARGV[A_EPOCH])
  -- older processes of this gateway are fenced here from now on: the
  -- invalidations kept for their beliefs are of no use to anyone
  redis.call('ZREMRANGEBYLEX', KEYS[5], invlo, invhi)
end
-- Beliefs learned in another incarnation (record.lua) are void.
local inc = incarnation(seen[3], redis.call('HGET', KEYS[2], INC), seen[4], now, ARGV[A_NOW] ~= '')
-- The caller last wrote to another incarnation: the shard's state was lost
-- or replaced since, and its renewals restore what it holds (as a
-- restore batch does, gateway.Batch.Restore): the caller re-sends its
-- other live sessions (ApplyResult.Reset).
local unrestored = ARGV[A_SEEN] ~= '' and ARGV[A_SEEN] ~= inc
if unrestored then
  restore = true
  redis.call('HSET', KEYS[4], CHANGED, nowstr)
  -- a new token: the state was lost (a restart without persistence,
  -- FLUSHALL), the gateways' liveness records with it (record.lua, LOSS);
  -- a new replication ID alone (a failover, a slot migration, a restart
  -- from a snapshot) keeps them
  local tok = string.match(inc, '^[^/]*')
  if string.match(ARGV[A_SEEN], '^[^/]*') ~= tok then
    redis.call('HSET', KEYS[4], LOSS, tok .. ' ' .. string.format('%d', incsince))
  end
end
-- The gateway's liveness on this shard (record.lua, "Gateway liveness"):
-- its coverage only moves forward (a call its caller gave up on may run
-- after a later one), except that a call that last wrote to another
-- incarnation covers nothing in this one: what it wrote there is not
-- here until its restore is (the gateway reports no coverage until then).
local _, _, covered = liveness(gwref)
if unrestored then
  covered = 0
elseif tonumber(ARGV[A_COVERED]) and (not covered or tonumber(ARGV[A_COVERED]) > covered) then
  covered = tonumber(ARGV[A_COVERED])
end
if covered then
  redis.call('HSET', KEYS[4], LIVE .. gwref, nowstr .. ' ' .. ARGV[A_BEHIND] .. ' ' .. string.format('%d', covered))
else
  redis.call('HSET', KEYS[4], LIVE .. gwref, nowstr .. ' ' .. ARGV[A_BEHIND])
end
local status = {}
-- A batch without writes only records the epoch (the uplink announces a
-- new process on every shard so that older epochs are fenced everywhere).
if ARGV[A_NFAST] == '0' and #ARGV < A_WRITES then return {1, inc, status, now} end

-- Believed renewals: the caller believes each device's record is in the
-- steady state for it (online, that one session, written by this gateway
-- and epoch), so such a renewal only moves the device deadline: no record
-- is read. Those of a device that may have changed since (invalidated,
-- due, or all of them when the beliefs predate this incarnation or too
-- many devices are due to tell) join the general writes below.
local nfast, order = tonumber(ARGV[A_NFAST]), ARGV[A_ORDER]
local slow, nslow, fastdev = {}, (#ARGV - A_WRITES + 1) / W_ARGS, {}
local function fastage(f)
  local b1, b2, b3, b4 = byte(ARGV[A_FASTAGES], 4 * f - 3, 4 * f)
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4
end
-- Hand the caller the invalidations kept for it (its beliefs about those
-- devices are void), whether or not it sends believed renewals this time.
local bad = {}
-- Devices held for their gateway's grace (record.lua, "Held devices")
-- take the general path, which undoes the hold.
local anyheld = redis.call('EXISTS', KEYS[6]) == 1
local gone = redis.call('ZRANGEBYLEX', KEYS[5], invlo, invhi)
if #gone > 0 then
  redis.call('ZREMRANGEBYLEX', KEYS[5], invlo, invhi)
  for _, m in ipairs(gone) do
    local dev = sub(m, #invlo + 14)
    bad[dev] = true
    status[#status + 1] = dev
    status[#status + 1] = ''
  end
end
if nfast > 0 then
  local allbad = ARGV[A_INC] ~= inc or now - (tonumber(ARGV[A_BELIEFAT]) or 0) > BELIEF_TTL
  if not allbad then
    local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 64)
    if #due == 64 then allbad = true end
    for _, dev in ipairs(due) do bad[dev] = true end
    if anyheld and not allbad then
      local list, at, fdevs = ARGV[A_FASTDEVS], 1, {}
      for f = 1, nfast do
        local stop = find(list, '\n', at, true) or #list + 1
        fdevs[f] = sub(list, at, stop - 1)
        at = stop + 1
      end
      local held = mcall('HMGET', KEYS[6], fdevs)
      for f = 1, nfast do
        if held[f] then bad[fdevs[f]] = true end
      end
    end
  end
  -- the hot loop of the steady state: fastage inlined, no # on zfast
  local zfast, nz, ages, base = {}, 0, ARGV[A_FASTAGES], evnow + lease
  local list, at = ARGV[A_FASTDEVS], 1
  for f = 1, nfast do
    local stop = find(list, '\n', at, true) or #list + 1
    local dev = sub(list, at, stop - 1)
    at = stop + 1
    fastdev[f] = dev
    local b1, b2, b3, b4 = byte(ages, 4 * f - 3, 4 * f)
    local d = base - (((b1 * 256 + b2) * 256 + b3) * 256 + b4)
    if allbad or bad[dev] or d <= now then
      slow[f] = true
      nslow = nslow + 1
    else
      nz = nz + 2
      zfast[nz - 1], zfast[nz] = d, dev
    end
  end
  -- XX: a believed device that left the index (reaped) is not put back
  -- here; CH counts the moved deadlines, and fewer than were sent means
  -- that some devices are gone or were already further out: those gone
  -- join the general writes (a reap left their record offline).
  local moved = 0
  for i = 1, nz, 1000 do
    moved = moved + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', unpack(zfast, i, math.min(i + 999, nz)))
  end
  if moved < nz / 2 then
    local sent = {}
    for i = 2, nz, 2 do sent[#sent + 1] = zfast[i] end
    local scores, absent = mcall('ZMSCORE', KEYS[1], sent), {}
    for i, dev in ipairs(sent) do
      if not scores[i] then absent[dev] = true end
    end
    for f = 1, nfast do
      if not slow[f] and absent[fastdev[f]] then
        slow[f] = true
        nslow = nslow + 1
      end
    end
  end
end
if nslow == 0 then return {1, inc, status, now} end
-- The general writes in batch order: the believed renewals sent back above
-- (as renewals) and the others: device, session, kind, age ms, lease ms,
-- and the grace of late evidence (the write's batch position p in
-- A_GRACED).
local gdev, gsid, gkind, gage, glease, ggrace = {}, {}, {}, {}, {}, {}
local function gracefor(p)
  if graced == '' or (graced ~= '-' and byte(graced, p) == GRACED) then return replaygrace end
  return 0
end
local fastsids
local f, oi, j = 1, A_WRITES, 0
for p = 1, nfast > 0 and #order or nslow do
  if nfast > 0 and byte(order, p) == BELIEVED then
    if slow[f] then
      if not fastsids then
        fastsids = {}
        for sid in string.gmatch(ARGV[A_FASTSIDS], '[^\n]+') do fastsids[#fastsids + 1] = sid end
      end
      j = j + 1
      gdev[j], gsid[j], gkind[j], gage[j], glease[j] = fastdev[f], fastsids[f], KIND_RENEW, fastage(f), lease
      ggrace[j] = gracefor(p)
    end
    f = f + 1
  else
    j = j + 1
    gdev[j], gsid[j], gkind[j], gage[j], glease[j] = ARGV[oi], ARGV[oi + 1], ARGV[oi + 2], ARGV[oi + 3], tonumber(ARGV[oi + 4])
    ggrace[j] = gracefor(p)
    oi = oi + W_ARGS
  end
end

-- bridged[j]: write j is a leave and a later write of the same call
-- carries live evidence of another session of its device (a device that
-- moved away and back while its gateway's writes waited in the outbox).
-- Such a leave of the device's last session does not end the device at
-- once: its offline waits for the end of the call (leaving), where it is
-- written only if no write brought the device a live session.
-- (Renewals alone, the steady state, cost one pass and no table.)
local bridged = {}
local leavedevs
for j = 1, nslow do
  if gkind[j] == KIND_LEAVE then
    leavedevs = leavedevs or {}
    leavedevs[gdev[j]] = true
  end
end
if leavedevs then
  local livesids = {}
  for j = nslow, 1, -1 do
    local dev, sid = gdev[j], gsid[j]
    local later = livesids[dev]
    if gkind[j] == KIND_LEAVE then
      if later then
        for s in pairs(later) do
          if s ~= sid then bridged[j] = true break end
        end
      end
    elseif leavedevs[dev] and glease[j] > tonumber(gage[j]) then
      if not later then
        later = {}
        livesids[dev] = later
      end
      later[sid] = true
    end
  end
end
-- leaving[k]: the session whose bridged leave left device k without a
-- session in this call; leavers: those k, in the order of the calls
local leaving, leavers = {}, {}
local function leave(k, sid)
  if not leaving[k] then leavers[#leavers + 1] = k end
  leaving[k] = sid
end

-- Load every device of the batch once. Device k (idx[dev] = k) has its
-- packed record packed[k], its deadline z[k] (false when it has none) and,
-- once decoded, its record rec[k]; dirty[k] and moved[k] say that the
-- record and the deadline must be written back.
local idx, devs = {}, {}
for j = 1, nslow do
  local d = gdev[j]
  if not idx[d] then
    devs[#devs + 1] = d
    idx[d] = #devs
  end
end
local packed = mcall('HMGET', KEYS[2], devs)
local scores = mcall('ZMSCORE', KEYS[1], devs)
local z, rec, dirty, moved, kept = {}, {}, {}, {}, {}
-- oldgws[k]: the gateway refs of the sessions of device k's record as
-- loaded, once decoded (record.lua, "Indexes": the session counts)
local oldgws = {}
for k = 1, #devs do z[k] = tonumber(scores[k]) or false end
-- A held device's sessions run until their true deadline plus the grace
-- (shift[k]): evidence observed within it is late but valid (the outbox
-- keeps only a session's newest evidence, so the evidence that bridged
-- the outage may be gone), and it sets the session's deadline from
-- itself; a leave is judged against the true deadline. The hold ends
-- with the first write of the device that changes its record or a
-- session's deadline (one that changes nothing, such as lapsed evidence,
-- leaves the hold and its true deadline).
local washeld, shift, renewed = {}, {}, {}
if anyheld then
  local held = mcall('HMGET', KEYS[6], devs)
  for k = 1, #devs do
    if held[k] then
      local truedl, untildl = heldfields(held[k])
      if z[k] == untildl then shift[k] = untildl - truedl end
      washeld[k] = true
    end
  end
end
local function setz(k, v)
  if z[k] ~= v then z[k], moved[k] = v, true end
end

-- The steady state is a renewal of a device's only session by the gateway
-- that wrote it last: its record is STEADY (online, last = session 0,
-- one session), ver, since, 0, then tails[sid] below, and the renewal moves
-- the device deadline only, leaving the record as it is.
local tailhead = uvarint(gwref) .. uvarint(epoch) .. char(0)
local tails = {}
local function renewsonly(p, sid)
  local i = steadyref(p)
  if not i then return false end
  local tail = tails[sid]
  if not tail then
    tail = tailhead .. wsid(sid, gwref, epoch)
    tails[sid] = tail
  end
  return #p == i - 1 + #tail and find(p, tail, i, true) == i
end

local events = {1, inc, status, now}
local function event(...) events[#events + 1] = emit(...) end

-- uncovered says that an expired session must wait rather than be
-- dropped by a write: its gateway reports coverage, and that coverage
-- has not reached the session's deadline (record.lua, "Gateway
-- liveness"). A gateway that reports none is not waited for here (the
-- reap judges it by its contact).
local coverage = {[gwref] = covered or false}
local function uncovered(ss)
  local c = coverage[ss.gw]
  if c == nil then
    local _, _, cv = liveness(ss.gw)
    c = cv or false
    coverage[ss.gw] = c
  end
  return c and c < ss.dl
end

-- awaited says whether another gateway than the caller, heard on the
-- shard within the horizon, has not covered obs: a device whose last
-- session leaves at obs may have moved to it, its connect still on the
-- way (record.lua, "Gateway liveness"). Read once per call.
local lagging
-- fresh: the incarnation began less than the grace ago (a loss, a
-- restart, a failover): the gateways the state does not know (a loss took
-- their liveness records; a snapshot minutes old knows those of its time)
-- may not have called yet, so any of them may lag (as the reap holds
-- every due device then).
local fresh
local function awaited(obs)
  if fresh == nil then
    fresh = now < incsince + replaygrace and redis.call('HEXISTS', KEYS[4], CHANGED) == 1
  end
  if fresh then return true end
  if horizon <= 0 then return false end
  if lagging == nil then
    lagging = false
    local last = tonumber(redis.call('HGET', KEYS[4], '#')) or 0
    for ref = 1, last do
      if ref ~= gwref then
        local at, _, cv = liveness(ref)
        if cv and withinhorizon(ref, at, now, horizon) and (not lagging or cv < lagging) then lagging = cv end
      end
    end
  end
  return lagging and lagging < obs
end

-- general applies one write to device k's decoded record (rec[k]); zk is
-- the device deadline as loaded or as renewed so far; d is the deadline
-- the write's evidence gives (observed at d - wlease, its lease); wgrace
-- is how late past its session's deadline it may be (below).
local function general(dev, sid, kind, d, k, zk, wlease, wgrace, isbridged)
  local r = rec[k]
  if not r and packed[k] then
    r = decode(packed[k], zk)
    rec[k] = r
    oldgws[k] = sessgws(r)
  end
  local obs = d - wlease
  -- lobs: the latest the store's clock may have read when a leave was
  -- observed (skew); its tombstone stands at obs, so that no evidence
  -- after the goodbye is taken for evidence before it, but for a last
  -- session held to lobs, whose tombstone moves there (leftat)
  local lobs = math.min(now, obs + skew)
  -- A leave re-sent by a restore (gateway.Batch.Restore) ends a session
  -- the store accepted the leave of before it lost or replaced its
  -- state. Where the record is online (the state kept the session, or
  -- another one: it ends by its own deadline), or offline since the leave
  -- was observed (its offline is there), it changes nothing; where the
  -- record is gone, or offline since before the leave (an older state's
  -- record of an earlier visit, while consumers last saw the device
  -- online), it writes the leave's offline, below.
  if kind == KIND_LEAVE and resent and r and (r.on or r.since >= obs) then return end
  -- Evidence observed at or before its session's leave never brings the
  -- session back (record.lua, "Leave tombstones").
  if r and kind ~= KIND_LEAVE and tombed(r, sid, obs, now) then return end
  -- Late but valid evidence: a connect or renew observed at or before
  -- its session's deadline extends that session even when the deadline
  -- has passed by now (an outage delayed it): no offline, no online.
  -- A replayed write, or one whose queue coalesced evidence while its
  -- sending was held up (Write.Coalesced; the caller sends the grace in
  -- A_GRACE and the writes it applies to in A_GRACED), may be up to the
  -- gateway grace late (wgrace): the outbox and the queue keep only a
  -- session's newest evidence, so the evidence that bridged the outage
  -- may be gone (as for a held device, above); so may any write of a
  -- session that ran out before a gap in the reaps ended (gaplate). A
  -- restore may be any late: the renewals that bridged the gap were acknowledged by the
  -- state that was lost (a failover to a replica that lacked them).
  local late
  -- sh is how far a hold moved the device's index entry, so its
  -- sessions' decoded deadlines (record.lua, "Held devices")
  local sh = shift[k] or 0
  if r and kind ~= KIND_LEAVE then
    for _, x in ipairs(r.sess) do
      if x.sid == sid and x.dl - sh <= now and (restore or obs <= x.dl - sh + wgrace or gaplate(x.dl - sh, obs)) then late = x break end
    end
  end
  if r and r.on then
    -- an expired session waits (the reap judges it) while its gateway's
    -- coverage, or that of another gateway heard within the horizon (the
    -- device may have moved there), has not reached its deadline
    local gone = dropexpired(r, now, late, function(ss) return uncovered(ss) or awaited(ss.dl - sh) end)
    if gone then
      dirty[k] = true
      setz(k, maxdl(r))
      -- evidence of another session observed by the deadline of the
      -- last one that ran out bridges it: the device was never silent (a
      -- move whose new gateway wrote late), no offline; a replayed or
      -- coalesced write up to its grace after it (its older evidence, the
      -- connect that came first, was merged away); so does any live
      -- evidence of a device whose session ran out before this
      -- incarnation began (a replaced state: it says nothing of the
      -- device since)
      if not z[k] and not (kind ~= KIND_LEAVE and d > now and (obs <= gone.dl + wgrace or gone.dl - sh < incsince or gaplate(gone.dl - sh, obs))) then
        r.on, r.ver, r.since = false, nextver(r, now), now
        local reason = leftat(r, gone) and 'leave' or 'expired'
        event(dev, 'offline', r.ver, nowstr, reason, gwname(gone.gw), gone.sid, zk and zk - sh)
      end
    end
  end
  local ss, at
  if r then
    for j, x in ipairs(r.sess) do
      if x.sid == sid then ss, at = x, j break end
    end
  end
  local recreated = false
  if kind ~= KIND_LEAVE then
    if d <= now then
      -- A restore of a session that ran out before the loss, whose record
      -- the store lost: its offline may never have been written. The
      -- record comes back online, without an event, its session ending
      -- now, for the reap to end it once this gateway's coverage reaches
      -- it (gateway.Batch.Restore). So does evidence observed before this
      -- incarnation began with a loss (LOSS) that ran out on its way, for
      -- a record the store does not have (a connect still queued when its
      -- gateway restored what it held, written after its lease ran out:
      -- the lost state may have had the device online). So does a
      -- restore for a record offline since before this incarnation began
      -- (a replaced state: a restart into an older snapshot may bring
      -- back an earlier visit's offline record, while consumers last saw
      -- the device online). Otherwise evidence that ran out changes
      -- nothing.
      if r then
        recreated = restore and not r.on and r.since < incsince
      elseif restore then
        recreated = true
      else
        -- LOSS: the lost state's token and the incarnation's start then
        local tok, at = string.match(redis.call('HGET', KEYS[4], LOSS) or '', '^(%S+) (%d+)$')
        recreated = tok == string.match(inc, '^[^/]*') and obs < tonumber(at)
      end
      if not recreated then
        -- Lapsed but late and valid evidence of a session the online
        -- record still holds (a replay after an outage longer than the
        -- lease): the session's passed deadline moves to the evidence's,
        -- so that the reap, which judges the device due either way,
        -- writes its offline with its true deadline.
        if late and r.on and d > late.dl - sh then
          late.dl, dirty[k] = d, true
          setz(k, maxdl(r))
        end
        return
      end
      d = now
    end
    local created = not r
    if created then
      r = newrecord(now)
      rec[k] = r
    end
    -- One rule in both stores (store/embedded): evidence at least as new
    -- as its session's takes the session (deadline, gateway, epoch); older
    -- evidence changes nothing of it. The device's last writer is the
    -- write of its newest evidence.
    local dl = maxdl(r)
    local isnewest = not dl or d >= dl - sh
    if not ss then
      if #r.sess >= MAX_SESSIONS then return end
      r.sess[#r.sess + 1] = {gw = gwref, ep = epoch, dl = d, sid = sid}
      dirty[k] = true
    elseif d >= ss.dl - sh then
      if d ~= ss.dl or sh ~= 0 then
        ss.dl, renewed[k] = d, true
        -- other sessions store offsets from the device deadline
        if #r.sess > 1 then dirty[k] = true end
      end
      if ss.gw ~= gwref or ss.ep ~= epoch then
        ss.gw, ss.ep, dirty[k] = gwref, epoch, true
      end
    end
    if isnewest and (r.lastgw ~= gwref or r.lastsid ~= sid) then
      r.lastgw, r.lastsid, dirty[k] = gwref, sid, true
    end
    setz(k, maxdl(r))
    if not r.on and (recreated or (kind == KIND_RENEW and ((restore and created) or (ARGV[A_REPLAY] == '2' and r.since < incsince)))) then
      -- a restore of a record the store lost: online, no event, a ver
      -- above the lost ones for the next (gateway.Batch.Restore); so is
      -- a restore batch's session, live or not, for a record offline
      -- since before this incarnation began (an older state's:
      -- consumers last saw the device as the gateway holds it, and a
      -- dead process's session comes with the latest deadline it can
      -- have had, which may be ahead of its last evidence's). Live
      -- evidence in a call that meets a new incarnation is not a
      -- restore's re-statement: it writes its online as any renewal.
      r.on, r.ver, r.since, dirty[k] = true, created and r.ver + 1 or nextver(r, now), now, true
    elseif not r.on then
      r.on, r.ver, r.since, dirty[k] = true, nextver(r, now), now, true
      local reason = 'renew'
      if replay then reason = 'replay' elseif kind == KIND_CONNECT then reason = 'connect' end
      event(dev, 'online', r.ver, nowstr, reason, gw, sid)
    end
  elseif restore and (not r or (resent and not r.on)) then
    -- a leave of a session the lost state held (the caller wrote it
    -- there, or re-sends it: above): its offline, with a ver above the
    -- lost ones; but while another gateway may not have restored the
    -- device yet (it may have moved there, as for a leave below), the
    -- record comes back online without an event, as a restore does, its
    -- session ending at the leave, for the reap to judge behind that
    -- gateway
    if r then
      r.ver, r.since = nextver(r, now), now
    else
      r = newrecord(now)
      rec[k] = r
      r.ver = r.ver + 1
    end
    entomb(r, sid, obs)
    r.lastgw, r.lastsid, dirty[k] = gwref, sid, true
    if isbridged then
      r.on, r.since = true, now
      leave(k, sid)
    elseif awaited(lobs) then
      r.on, r.since = true, now
      entomb(r, sid, lobs)
      r.sess[1] = {gw = gwref, ep = epoch, dl = lobs, sid = sid}
      setz(k, lobs)
    else
      event(dev, 'offline', r.ver, nowstr, 'leave', gw, sid)
    end
  elseif r and not (ss and ss.dl - sh > d) then
    -- a leave of a session the record holds (not renewed since), or of
    -- one it no longer holds: either way its tombstone stands
    entomb(r, sid, obs)
    dirty[k] = true
    if ss then
      table.remove(r.sess, at)
      r.lastgw, r.lastsid = gwref, sid
      setz(k, maxdl(r))
      if not z[k] and r.on then
        if isbridged then
          leave(k, sid)
        elseif awaited(lobs) then
          -- the device's last session leaves while another gateway's
          -- coverage lags: it ends at the leave, as a session that ran
          -- out there, for the reap to judge behind that gateway (its
          -- tombstone names the offline a leave, reap.lua); the other
          -- gateway's evidence dated up to lobs bridges it (above), and
          -- its tombstone moves there too, so that the reap still names
          -- it a leave (leftat)
          entomb(r, sid, lobs)
          ss.dl, ss.gw, ss.ep = lobs, gwref, epoch
          r.sess[1] = ss
          setz(k, lobs)
        else
          r.on, r.ver, r.since = false, nextver(r, now), now
          event(dev, 'offline', r.ver, nowstr, 'leave', gw, sid)
        end
      end
    end
  end
end

for j = 1, nslow do
  local dev, sid, kind, wlease = gdev[j], gsid[j], gkind[j], glease[j]
  local d = evnow - tonumber(gage[j]) + wlease
  local k = idx[dev]
  local zk = z[k]
  if kind ~= KIND_LEAVE and d > now and zk and zk > now and not shift[k] and not rec[k] and packed[k] and renewsonly(packed[k], sid) then
    if d > zk then z[k], moved[k] = d, true end
    kept[k] = sid
  else
    general(dev, sid, kind, d, k, zk, wlease, ggrace[j], bridged[j])
  end
end

-- The offline of a bridged leave whose device no later write of the call
-- gave a live session.
for _, k in ipairs(leavers) do
  local r = rec[k]
  if r.on and not z[k] then
    r.on, r.ver, r.since, dirty[k] = false, nextver(r, now), now, true
    event(devs[k], 'offline', r.ver, nowstr, 'leave', gw, leaving[k])
  end
end

-- Write back; a record another gateway may hold a belief about (record.lua,
-- believer) that changes here is invalidated for that gateway, and every
-- device of the general writes gets its status for the caller.
local hset, zadd, zrem, inv, unhold = {}, {}, {}, {}, {}
-- turnedon: the call's net change of the shard's online records (Counts)
local turnedon = 0
for k, dev in ipairs(devs) do
  if washeld[k] and (moved[k] or dirty[k] or renewed[k] or not shift[k]) then unhold[#unhold + 1] = dev end
  if dirty[k] then
    local wason = packed[k] and isonline(packed[k]) or false
    if rec[k].on ~= wason then turnedon = turnedon + (rec[k].on and 1 or -1) end
    reindex(dev, packed[k], rec[k].on, rec[k].since)
    movesessions(oldgws[k], rec[k])
    prunetombs(rec[k], now - TOMB_KEEP)
    hset[#hset + 1] = dev
    hset[#hset + 1] = encode(rec[k])
    local og = packed[k] and believer(packed[k])
    if og and og ~= gwref then
      inv[#inv + 1] = 0
      inv[#inv + 1] = invalidation(og, now, dev)
    end
  end
  if moved[k] then
    if z[k] then
      zadd[#zadd + 1] = z[k]
      zadd[#zadd + 1] = dev
    else
      zrem[#zrem + 1] = dev
    end
  end
  status[#status + 1] = dev
  local r = rec[k]
  if r then
    status[#status + 1] = steadysid(r, gwref, epoch) or ''
  else
    status[#status + 1] = kept[k] or ''
  end
end
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
if #inv > 0 then mcall('ZADD', KEYS[5], inv) end
if #unhold > 0 then mcall('HDEL', KEYS[6], unhold) end
countonline(turnedon)
ixflush()
trim(maxlen)
return events
