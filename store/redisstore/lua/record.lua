-- fleetgate Redis store, schema 1: the packed device record and helpers
-- shared by the apply, reap and view scripts (the Go side prepends this
-- file to each of them).
--
-- Keys of a shard s (all in the hash slot of {P:s}):
--   KEYS[1] {P:s}:exp     ZSET   device -> device deadline (ms, store clock)
--   KEYS[2] {P:s}:dev     HASH   device -> packed record (below); "~" ->
--                                the incarnation token (as in KEYS[4])
--   KEYS[3] {P:s}:events  STREAM presence events
--   KEYS[4] {P:s}:epochs  HASH   gw -> newest epoch; "@"..gw -> gateway ref n;
--                                "#"..n -> gw; "#" -> last ref handed out;
--                                "%" -> the ver floor (VFLOOR, below);
--                                "~" -> incarnation token (TIME when first
--                                written); "^" -> "<replid> <ms>": the
--                                server replication ID last seen and the
--                                store time it was first seen
--   KEYS[5] {P:s}:inv     ZSET   "<ref>:<ms, 13 digits>:<device>", all score 0
--                                (ranges by gateway and age): invalidated beliefs
--   KEYS[6] {P:s}:held    HASH   device -> "<true deadline> <held until>" (ms):
--                                devices held for their gateway's grace
--   KEYS[7] {P:s}:gateways STREAM gateway events (`lost`, `back`); only
--                                shard 0's is written (reap.lua)
--   KEYS[8] {P:s}:idx     ZSET   the records by ID and by last change, all
--                                score 0 (ranges by lex): "Indexes", below
-- and in KEYS[4] also "!"..ref -> "<contact ms> <behind 0|1>": the liveness
-- of gateway ref on this shard, "$"..ref -> the live sessions of gateway
-- ref in the shard ("Indexes", below), and on shard 0 "L"..ref -> the
-- contact ms of a gateway reported lost (until it is back).
--
-- Packed record (integers: uvarint = unsigned LEB128; t48 = 6 bytes
-- big-endian unsigned):
--   flags   1 byte: bit 0 online, bit 1 "last session is a live session",
--           bits 2..7 session count, 63 meaning uvarint (count - 63) follows
--   ver     uvarint
--   since   t48 ms
--   last    bit 1 set: uvarint index into the sessions below;
--           else uvarint gateway ref, then a literal sid
--   sessions, each:
--           uvarint gateway ref, uvarint epoch,
--           uvarint (device deadline - session deadline) in ms, sid
--   sid     uvarint t: t odd is the connection form "<gw>/<epoch>/<(t-1)/2>"
--           of the session's own gateway and epoch; t even: t/2 bytes follow
--   then, only when the record holds leave tombstones (below):
--           uvarint T, then T times: t48 ms the leave was observed, sid
--           (literal form)
-- The device deadline is the device's score in {P:s}:exp, so a single-session
-- device stores offset 0 and a renewal that changes nothing else leaves the
-- record untouched.

-- Beliefs: a gateway process (gateway, epoch) may believe that a device's
-- record is steady for it: online, one session, that session and the last
-- one written by this gateway and epoch (flags 7, see steadysid). The
-- apply script tells the caller which records are steady for it after each
-- call, and takes a renewal the caller marks as believed without reading
-- the record. So an apply that changes a record another gateway may hold a
-- belief about (believer) adds an invalidation for that gateway to
-- {P:s}:inv, and that gateway's next apply drops those beliefs before it
-- uses any. A reap leaves a steady record offline and its device out of
-- the index without a word: a believed renewal finds the device gone
-- (ZADD XX ... CH) and takes the general path, and an apply that changes
-- the offline record first invalidates its last writer's belief. The
-- incarnation (the "~" field of the epochs hash and the server's
-- replication ID) changes when the shard's state is lost, when its server
-- restarts and when a replica takes over (each may have lost writes):
-- every belief learned before is void. A
-- gateway's invalidations are handed to it by its next apply; those of a
-- gateway that does not come back are forgotten after an hour (each reap
-- call cleans one gateway ref's), and a gateway uses a belief for ten
-- minutes at most after learning it.

local byte, char, sub, find = string.byte, string.char, string.sub, string.find

-- Incarnation: the shard's state is one incarnation as long as its token
-- (the "~" field, in both the epochs hash and the device hash, so that
-- the loss of either starts a new one) and its server's replication ID
-- stay the same. The replication ID changes when the server restarts
-- (its data may be an older snapshot), when a replica takes over (it
-- may lack the last writes), and when a master without a replication
-- backlog (after a restart) gets its first replica. incarnation() returns "<token>/<replid>" and
-- sets incsince, the store time since which it holds.
local INC, REPL = '~', '^'
-- LOSS is "<token> <ms>": the token in which a caller reported having
-- written to one with another token (apply's A_SEEN), and the start of
-- the incarnation at that report: the state began with a loss (a restart
-- without persistence, FLUSHALL), and evidence observed before it that
-- ran out on its way recreates a record the state lost (apply.lua). It
-- names the token, not the whole incarnation: a master's replication ID
-- changes again when its first replica attaches after the restart
-- (Redis makes a new one with the backlog), and that second incarnation
-- is the same lost state, not a new one.
local LOSS = '~l'
-- CHANGED is the store time of a call that reported having written to
-- another incarnation (apply's A_SEEN), or a reap by a runner that had
-- reaped another (reap's R_SEEN): once set, the shard's
-- state is not a new store's, and each new incarnation (a loss, a restart
-- into a snapshot, a failover) holds every due device for the grace from
-- its start (reap.lua, apply.lua: fresh). A new store's first incarnation
-- has none: nothing was held before it.
local CHANGED = '~n'
local incsince = 0
--
-- givenclock says that now is the caller's clock (Store Options.Now)
-- rather than the server's TIME: callers read it before their calls run,
-- so a call may run with a now earlier than one that ran before it. Then
-- the incarnation's start moves back to that now, or a record the call
-- writes would count as older than the incarnation (nextver). TIME, read
-- inside the script, runs in the order the calls do.
local function incarnation(tok, devtok, repl, now, givenclock)
  local fresh = false
  if not tok or tok ~= devtok then
    local t = redis.call('TIME')
    tok = t[1] .. '.' .. t[2]
    redis.call('HSET', KEYS[4], INC, tok)
    redis.call('HSET', KEYS[2], INC, tok)
    fresh = true
  end
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
  local seenid, since = string.match(repl or '', '^(%x*) (%d+)$')
  incsince = tonumber(since)
  if fresh or seenid ~= replid or (givenclock and now < incsince) then
    redis.call('HSET', KEYS[4], REPL, replid .. ' ' .. string.format('%d', now))
    incsince = now
  end
  return tok .. '/' .. replid
end

-- Gaps: REAPED in the epochs hash is the store time of the shard's last
-- reap (written only while the caller passes a maximum gap), GAPEND the
-- end of the last gap in the reaps: a reap that finds the last one more
-- than that maximum ago. Whatever stopped the reaps (the store paused,
-- every runner stopped or starved, the host or VM frozen) may have
-- stopped the gateways as well, so their silence over it is no evidence:
-- the gap counts as an outage that ends at that reap (GAPEND), for every
-- runner of the shard (reap.lua), and a session that ran out before its
-- end was never judged: evidence of it observed up to the grace after
-- the gap's end is late but valid (apply.lua), as is any while a gap is
-- under way (no reap for longer than the maximum).
local REAPED, GAPEND = '~p', '~g'

-- Versions never repeat (invariant 10, docs/design.md §7): a new record's first ver is the store
-- time in ms (a record lost with the shard's data, or with its hash,
-- restarts above every ver it handed out), and a record last changed
-- before the current incarnation began (a failover to a lagging replica
-- may have lost its newest versions) continues from the store time when
-- that is higher. Otherwise ver counts up by one per transition.
local function nextver(r, now)
  if r.since < incsince and now > r.ver then return now end
  return r.ver + 1
end

-- VFLOOR in the epochs hash is the shard's ver floor: the highest ver of
-- a device forgotten in it (forget.lua), absent for none. A device seen
-- anew starts above it, so that a forgotten device that comes back never
-- repeats a ver even when the store time has not passed its last.
local VFLOOR = '%'
local function verfloor()
  return tonumber(redis.call('HGET', KEYS[4], VFLOOR)) or 0
end

-- newrecord is the record of a device seen for the first time at now (or
-- for the first time since it was forgotten): its first ver is now, or
-- one above the ver floor.
local function newrecord(now)
  return {on = false, ver = math.max(now, verfloor() + 1) - 1, since = now, sess = {}, tombs = {}}
end

-- Leave tombstones: a session that left keeps, in its device's record, the
-- store time its leave was observed, so that a connect or renew observed
-- before it (a stale one, through another gateway or from an
-- outbox) never brings the session back. A tombstone is kept for
-- TOMB_KEEP (evidence is trusted for its lease at most, and no lease is
-- that long), and at most MAX_TOMBS per record (the oldest go first).
local MAX_TOMBS = 8

-- A device holds at most MAX_SESSIONS sessions in the store, however many
-- gateways it reaches (each bounds its own at limits.max_sessions_per_device,
-- default 32): a connect or renew of a new session beyond it is ignored, so
-- a script's work stays bounded by the sessions of its batch's devices
-- (gateway.MaxStoreSessions).
local MAX_SESSIONS = 256
local TOMB_KEEP = 86400000

-- Gateway liveness: every apply call records, in the epochs hash under
-- LIVE..ref, "<contact> <behind> <coverage>": the store time of the call,
-- whether the gateway is behind (its outbox still holds writes), and the
-- gateway's coverage on this shard (gateway.Batch.Covers: every evidence
-- it observed before that store time has reached the store), the latest
-- any of its calls reported (absent while none did: an older release).
-- The uplink makes a call on every shard at least every keep-alive, so a
-- gateway whose contact is older than the silence the runner allows has
-- lost the store (or died). In a new incarnation a gateway covers
-- nothing until it has restored what it holds: apply records coverage 0
-- for a call that last wrote to another incarnation, and the gateway
-- reports none while its restore is under way.
local LIVE = '!'

-- LOST..ref in the epochs hash marks a gateway the reap reported lost
-- (reap.lua, gateway events).
local LOST = 'L'

-- withinhorizon says whether gateway ref, whose liveness record says it
-- called at at, may still hold evidence not written: it called within
-- the horizon; or its record is from before this incarnation (a replaced
-- state: the time is that state's, not the gateway's last call), it was
-- not reported lost there, and the incarnation is younger than the
-- horizon.
local function withinhorizon(ref, at, now, horizon)
  if not at then return false end
  if now - at <= horizon then return true end
  return at < incsince and now - incsince <= horizon and redis.call('HEXISTS', KEYS[4], LOST .. ref) == 0
end

-- liveness reads gateway ref's liveness record: its contact (nil when it
-- has none), whether it is behind, and its coverage (nil when none).
local function liveness(ref)
  local s = redis.call('HGET', KEYS[4], LIVE .. ref)
  if not s then return nil, false, nil end
  local at, behind, cov = string.match(s, '^(%d+) (%d) ?(%d*)$')
  at, cov = tonumber(at), tonumber(cov)
  -- a record from before this incarnation (a replaced state: a failover,
  -- a restart from a snapshot) tells nothing of what the gateway has
  -- written to this one: its coverage counts as none until it calls
  if cov and at < incsince then cov = 0 end
  return at, behind == '1', cov
end

-- Held devices: a device that falls due while the coverage of one of its
-- sessions' gateways has not reached that session's deadline (that
-- gateway may hold evidence not yet written: a slow store, a slow
-- gateway, an outage) is not reaped but held: its deadline in the index
-- moves (its record is unchanged: session deadlines are offsets from the
-- index entry) and {P:s}:held keeps its true deadline and the new one.
-- While the gateway is heard the reap looks again a recheck later; while
-- it is not, at the end of the grace. Late but valid evidence replayed
-- meanwhile is judged against the true deadline and undoes the hold
-- (apply); at the end of the grace the reap writes the offline event
-- with the true deadline, reason gateway_lost if the coverage has still
-- not reached it, else expired.
local function heldfields(s)
  local a, b = string.match(s, '^(%d+) (%d+)$')
  return tonumber(a), tonumber(b)
end

-- The packed record's head, decoded here (decode, and for the byte-level
-- fast paths isonline, steadyref, owner and believer) with these names:
-- the flags byte, then ver (uvarint), then since (SINCE_LEN bytes).
local F_ONLINE = 1      -- flags bit 0
local F_LASTREF = 2     -- flags bit 1: last is an index into the sessions
local F_COUNT = 4       -- the session count is flags / F_COUNT (bits 2..7)
local COUNT_MORE = 63   -- a count of 63 means uvarint (count - 63) follows
local SINCE_LEN = 6
-- STEADY is the flags of a record online with one session that is the
-- last one written (the steady state of a renewing device).
local STEADY = F_ONLINE + F_LASTREF + F_COUNT

-- afterhead is the index of a packed record's first byte after its head
-- (flags, ver, since): the last-session index or gateway ref.
local function afterhead(p)
  local i = 2
  while byte(p, i) >= 128 do i = i + 1 end
  return i + 1 + SINCE_LEN
end

-- hasflag reports whether flags has bit f (F_ONLINE or F_LASTREF) set.
local function hasflag(flags, f)
  return flags % (2 * f) >= f
end

-- isonline reports whether a packed record is online.
local function isonline(p)
  return hasflag(byte(p, 1), F_ONLINE)
end

-- steadyref is the index of the gateway ref of a steady record's only
-- session, which is the last one (flags STEADY, then after the head the
-- last-session index 0), or nil for any other record. The session's
-- epoch, offset and sid follow the ref (see the format above).
local function steadyref(p)
  if byte(p, 1) ~= STEADY then return nil end
  local i = afterhead(p)
  if byte(p, i) ~= 0 then return nil end
  return i + 1
end

local function uvarint(n)
  if n < 128 then return char(n) end
  local t = {}
  while n >= 128 do
    local b = n % 128
    t[#t + 1] = b + 128
    n = (n - b) / 128
  end
  t[#t + 1] = n
  return char(unpack(t))
end

local function ruvarint(s, i)
  local n, mul = 0, 1
  while true do
    local b = byte(s, i)
    i = i + 1
    if b < 128 then return n + b * mul, i end
    n = n + (b - 128) * mul
    mul = mul * 128
  end
end

local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Gateway names by ref, cached for the call.
local gwnames = {}
local function gwname(ref)
  local n = gwnames[ref]
  if n == nil then
    n = redis.call('HGET', KEYS[4], '#' .. ref)
    if not n then n = '?' .. ref end
    gwnames[ref] = n
  end
  return n
end

-- connprefix is "<gw>/<epoch>/" for a gateway ref and epoch, cached.
local prefixes = {}
local function connprefix(ref, ep)
  local byref = prefixes[ref]
  if not byref then
    byref = {}
    prefixes[ref] = byref
  end
  local p = byref[ep]
  if not p then
    p = gwname(ref) .. '/' .. string.format('%d', ep) .. '/'
    byref[ep] = p
  end
  return p
end

local function rsid(s, i, ref, ep)
  local t
  t, i = ruvarint(s, i)
  if t % 2 == 1 then
    return connprefix(ref, ep) .. string.format('%d', (t - 1) / 2), i
  end
  local j = i + t / 2
  return sub(s, i, j - 1), j
end

local function wsid(sid, ref, ep)
  if ref then
    local p = connprefix(ref, ep)
    if sub(sid, 1, #p) == p then
      local rest = sub(sid, #p + 1)
      if #rest <= 15 and (rest == '0' or find(rest, '^[1-9]%d*$')) then
        return uvarint(tonumber(rest) * 2 + 1)
      end
    end
  end
  return uvarint(#sid * 2) .. sid
end

-- decode turns a packed record into a table; deadline is the device's
-- score in {P:s}:exp (false when absent).
--   {on, ver, since, lastgw, lastsid, sess = {{gw, ep, dl, sid}...}}
local function decode(s, deadline)
  local flags = byte(s, 1)
  local r = {on = hasflag(flags, F_ONLINE), sess = {}}
  local isref = hasflag(flags, F_LASTREF)
  local count = math.floor(flags / F_COUNT)
  local i = 2
  r.ver, i = ruvarint(s, i)
  r.since = struct.unpack('>I6', s, i)
  i = i + SINCE_LEN
  local lastidx
  if isref then
    lastidx, i = ruvarint(s, i)
  else
    r.lastgw, i = ruvarint(s, i)
    r.lastsid, i = rsid(s, i)
  end
  if count == COUNT_MORE then
    local more
    more, i = ruvarint(s, i)
    count = count + more
  end
  local dd = tonumber(deadline) or 0
  for k = 1, count do
    local ss = {}
    ss.gw, i = ruvarint(s, i)
    ss.ep, i = ruvarint(s, i)
    local off
    off, i = ruvarint(s, i)
    ss.dl = dd - off
    ss.sid, i = rsid(s, i, ss.gw, ss.ep)
    r.sess[k] = ss
  end
  if isref then
    local ls = r.sess[lastidx + 1]
    r.lastgw, r.lastsid = ls.gw, ls.sid
  end
  r.tombs = {}
  if i <= #s then
    local n
    n, i = ruvarint(s, i)
    for k = 1, n do
      local t = struct.unpack('>I6', s, i)
      local sid
      sid, i = rsid(s, i + SINCE_LEN)
      r.tombs[k] = {t = t, sid = sid}
    end
  end
  return r
end

-- tombed reports whether evidence of session sid observed at obs comes
-- before that session's leave (evidence of the same millisecond counts
-- in the order the store applies it, as a leave does), at now. A
-- tombstone later than now (the store clock went back) is not held
-- against anything.
local function tombed(r, sid, obs, now)
  for _, x in ipairs(r.tombs) do
    if x.sid == sid and obs < x.t and x.t <= now then return true end
  end
  return false
end

-- leftat says whether session ss ended with its leave: a tombstone of
-- its sid observed at or after its deadline (a last session that left
-- while another gateway's coverage lagged is kept until the reap with the
-- leave's time as its deadline, apply.lua); its offline is a leave.
local function leftat(r, ss)
  for _, x in ipairs(r.tombs) do
    if x.sid == ss.sid and x.t >= ss.dl then return true end
  end
  return false
end

-- entomb records that session sid left, observed at t (the oldest
-- tombstones beyond MAX_TOMBS go; the write-back prunes those past
-- TOMB_KEEP, prunetombs).
local function entomb(r, sid, t)
  local kept = {}
  for _, x in ipairs(r.tombs) do
    if x.sid == sid then
      if x.t > t then t = x.t end
    else
      kept[#kept + 1] = x
    end
  end
  kept[#kept + 1] = {t = t, sid = sid}
  while #kept > MAX_TOMBS do table.remove(kept, 1) end
  r.tombs = kept
end

-- prunetombs forgets the tombstones observed at or before horizon.
local function prunetombs(r, horizon)
  local kept = {}
  for _, x in ipairs(r.tombs) do
    if x.t > horizon then kept[#kept + 1] = x end
  end
  r.tombs = kept
end

-- newest is the session that runs out last (the one an expiry names), or
-- nil.
local function newest(r)
  local m
  for _, ss in ipairs(r.sess) do
    if not m or ss.dl > m.dl then m = ss end
  end
  return m
end

-- invalidation is the {P:s}:inv member voiding gateway ref g's belief
-- about dev at store time now.
local function invalidation(g, now, dev)
  return g .. ':' .. string.format('%013d', now) .. ':' .. dev
end

-- owner is the gateway ref of a steady record's session (flags STEADY:
-- online, one session, the last one), or nil.
local function owner(p)
  local i = steadyref(p)
  if not i then return nil end
  return (ruvarint(p, i))
end

-- believer is the gateway ref that may hold a belief about a record: the
-- owner of a steady record, or the last writer of an offline one (a reap
-- leaves a steady record offline without telling its owner, whose
-- believed renewals then find the device gone from the index), or nil.
local function believer(p)
  -- online, or last given as an index: only a steady record has a believer
  if byte(p, 1) % F_COUNT ~= 0 then return owner(p) end
  -- offline, last given as a gateway ref and a literal sid
  return (ruvarint(p, afterhead(p)))
end

-- steadysid is the session of a decoded record that is steady for gateway
-- ref g and epoch e (online, that one session, the last one, without a
-- leave tombstone), or nil.
local function steadysid(r, g, e)
  if not r.on or #r.sess ~= 1 then return nil end
  local ss = r.sess[1]
  if ss.gw ~= g or ss.ep ~= e or r.lastgw ~= g or r.lastsid ~= ss.sid then return nil end
  -- a believed renewal is not read against the record: none while the
  -- session has a leave tombstone (evidence older than the leave must
  -- meet it)
  for _, x in ipairs(r.tombs) do
    if x.sid == ss.sid then return nil end
  end
  return ss.sid
end

-- maxdl is the device deadline: the latest session deadline, or false.
local function maxdl(r)
  local m = false
  for _, ss in ipairs(r.sess) do
    if not m or ss.dl > m then m = ss.dl end
  end
  return m
end

local function encode(r)
  local dd = maxdl(r) or 0
  local count = #r.sess
  local flags = (r.on and F_ONLINE or 0) + F_COUNT * math.min(count, COUNT_MORE)
  local lastidx
  for k, ss in ipairs(r.sess) do
    if ss.sid == r.lastsid and ss.gw == r.lastgw then
      lastidx = k - 1
      break
    end
  end
  local out = {}
  if lastidx then
    flags = flags + F_LASTREF
    out[1] = uvarint(r.ver) .. struct.pack('>I6', r.since) .. uvarint(lastidx)
  else
    out[1] = uvarint(r.ver) .. struct.pack('>I6', r.since) .. uvarint(r.lastgw) .. wsid(r.lastsid)
  end
  if count >= COUNT_MORE then out[#out + 1] = uvarint(count - COUNT_MORE) end
  for _, ss in ipairs(r.sess) do
    out[#out + 1] = uvarint(ss.gw) .. uvarint(ss.ep) .. uvarint(dd - ss.dl) .. wsid(ss.sid, ss.gw, ss.ep)
  end
  local tombs = r.tombs
  if tombs and #tombs > 0 then
    out[#out + 1] = uvarint(#tombs)
    for _, x in ipairs(tombs) do
      out[#out + 1] = struct.pack('>I6', x.t) .. wsid(x.sid)
    end
  end
  return char(flags) .. table.concat(out)
end

-- dropexpired removes the sessions whose deadline is <= now, except keep
-- (a session that late but valid evidence is about to extend; may be
-- nil) and those for which wait (a function of the session; may be nil)
-- is true. It returns the removed session that ran out last (the one an
-- expiry of the device names), or nil when none was removed.
local function dropexpired(r, now, keep, wait)
  local kept, last = {}, nil
  for _, ss in ipairs(r.sess) do
    if ss.dl > now or ss == keep or (wait and wait(ss)) then
      kept[#kept + 1] = ss
    elseif not last or ss.dl > last.dl then
      last = ss
    end
  end
  r.sess = kept
  return last
end

-- emit appends an event to the shard's stream and returns it as the
-- scripts report it: {id, device, state, ver, at, reason, gw, session, deadline}.
-- The stream is capped once per script call, by trim.
local emitted = 0
local function emit(dev, state, ver, at, reason, gw, sid, deadline)
  local id
  if deadline then
    id = redis.call('XADD', KEYS[3], '*',
      'device', dev, 'state', state, 'ver', ver, 'at', at, 'reason', reason,
      'gw', gw, 'session', sid, 'deadline', deadline)
  else
    id = redis.call('XADD', KEYS[3], '*',
      'device', dev, 'state', state, 'ver', ver, 'at', at, 'reason', reason,
      'gw', gw, 'session', sid)
  end
  emitted = emitted + 1
  return {id, dev, state, ver, at, reason, gw, sid, deadline or 0}
end

-- trim caps the stream at about maxlen entries (MAXLEN ~) when the call
-- appended events: one trim per call instead of one per event.
local function trim(maxlen)
  if emitted > 0 then redis.call('XTRIM', KEYS[3], 'MAXLEN', '~', maxlen) end
end

-- mcall runs a variadic command over list in chunks that stay below
-- Lua's unpack limit; it returns the concatenated replies (for reads).
local function mcall(cmd, key, list)
  local step = 1000
  if #list <= step then return redis.call(cmd, key, unpack(list)) end
  local res = {}
  for i = 1, #list, step do
    local r = redis.call(cmd, key, unpack(list, i, math.min(i + step - 1, #list)))
    if type(r) == 'table' then
      for j = 1, #r do res[#res + 1] = r[j] end
    end
  end
  return res
end

-- Counts (Store.Counts): the device hash keeps the number of its online
-- records in the field ONLINE_COUNT (a field name no device ID can take,
-- like INC); the scripts that turn a record online or offline move it by
-- the net change of their call. A hash without it (a store written by an
-- older release) is counted once by view.lua's "counts", which sets it;
-- until then the scripts leave it absent. Offline records are the others
-- (HLEN less the fields named with INC's prefix).
local ONLINE_COUNT = '~on'
local function countonline(delta)
  if delta ~= 0 and redis.call('HEXISTS', KEYS[2], ONLINE_COUNT) == 1 then
    redis.call('HINCRBY', KEYS[2], ONLINE_COUNT, delta)
  end
end

-- Gateway events in the event log (Store.ReadEvents: the watch API, the
-- publisher): shard 0's reap writes each lost or back event (reap.lua)
-- to the shard's events stream too, as an entry without a device:
-- gateway, state, ver, at, contact. GWVER..ref in the epochs hash keeps
-- the gateway's last ver; the next is one more, or the store time in ms
-- when that is higher (the first; and after a loss of the state), so
-- that (gateway, ver) never repeats.
local GWVER = '~v'
local function gatewayevent(ref, state, now, contact)
  local ver = now
  local last = tonumber(redis.call('HGET', KEYS[4], GWVER .. ref))
  if last and last >= now then ver = last + 1 end
  redis.call('HSET', KEYS[4], GWVER .. ref, string.format('%d', ver))
  redis.call('XADD', KEYS[3], '*', 'gateway', gwname(ref), 'state', state, 'ver', string.format('%d', ver),
    'at', string.format('%d', now), 'contact', string.format('%d', contact))
  emitted = emitted + 1
end

-- Indexes (Store.List, Store.Gateways): KEYS[8], a ZSET whose members
-- all have score 0, so that ranges go by lex (view.lua reads them):
--   IX_ID .. device        every record, by ID: added with a new record,
--                          removed when it is forgotten
--   IX_ON|IX_OFF .. t48 since .. device
--                          every record by its state and last change
--                          (since, 6 bytes big-endian): moved by a
--                          transition, never by a renewal
--   IX_BUILT .. token      the index was built from the records in the
--                          incarnation of that token (view.lua, ensure)
-- and in the epochs hash SESS .. ref, the live sessions of gateway ref
-- in the shard, moved by the writes that add, move or drop a session.
-- The scripts keep both whether or not the index was built; view.lua
-- builds it (and the session counts) afresh from the records, in one
-- call, when IX_BUILT does not name the shard's token: a store written
-- by an older release, or a state that was lost or replaced.
local IX_ID, IX_OFF, IX_ON, IX_BUILT = 'i', '0', '1', '~'
local SESS = '$'

-- chgmember is the change index member of a record of dev.
local function chgmember(on, since, dev)
  return (on and IX_ON or IX_OFF) .. struct.pack('>I6', since) .. dev
end

-- headsince is the since of a packed record.
local function headsince(p)
  return struct.unpack('>I6', p, afterhead(p) - SINCE_LEN)
end

-- The index and session count changes of a call, written once by
-- ixflush: reindex notes a record of dev that was oldp (a packed record,
-- nil for none) and is now on since (on nil: removed); movesess notes n
-- more sessions of gateway ref.
local ixadd, ixrem, sessdelta = {}, {}, {}
local function reindex(dev, oldp, on, since)
  local was = oldp and chgmember(isonline(oldp), headsince(oldp), dev)
  local is = on ~= nil and chgmember(on, since, dev)
  if was == is then return end
  if was then
    ixrem[#ixrem + 1] = was
  else
    ixadd[#ixadd + 1] = 0
    ixadd[#ixadd + 1] = IX_ID .. dev
  end
  if is then
    ixadd[#ixadd + 1] = 0
    ixadd[#ixadd + 1] = is
  else
    ixrem[#ixrem + 1] = IX_ID .. dev
  end
end
local function movesess(ref, n)
  sessdelta[ref] = (sessdelta[ref] or 0) + n
end
-- sessgws is the gateway refs of a decoded record's sessions.
local function sessgws(r)
  local gws = {}
  for k, ss in ipairs(r.sess) do gws[k] = ss.gw end
  return gws
end
-- movesessions notes a record whose sessions' gateways were was (nil
-- for none) and are those of r (nil: removed).
local function movesessions(was, r)
  local same = r and was and #was == #r.sess
  if same then
    for k, ss in ipairs(r.sess) do
      if ss.gw ~= was[k] then same = false break end
    end
  end
  if same then return end
  for _, g in ipairs(was or {}) do movesess(g, -1) end
  if r then
    for _, ss in ipairs(r.sess) do movesess(ss.gw, 1) end
  end
end
local function ixflush()
  if #ixrem > 0 then mcall('ZREM', KEYS[8], ixrem) end
  if #ixadd > 0 then mcall('ZADD', KEYS[8], ixadd) end
  for ref, n in pairs(sessdelta) do
    if n ~= 0 then redis.call('HINCRBY', KEYS[4], SESS .. ref, n) end
  end
end
