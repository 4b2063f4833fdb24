-- Forget one device (Store.Forget), atomically in its shard.
-- KEYS: exp, dev, events, epochs, inv, held, gateways, idx (record.lua;
-- all but gateways are used here).
-- ARGV (the G_ positions): device, the gateway that forgets it, now ms or
-- "", events maxlen.
-- The device's packed record (its sessions and leave tombstones), its
-- deadline index entry, its index entries and its hold go (and the
-- record leaves the counts, record.lua "Counts", and its sessions their
-- gateways' counts, "Indexes"); the gateway that may hold a
-- belief about the record gets an invalidation (a believed renewal must
-- not take a new record of the device for the one it knew); the shard's
-- ver floor (VFLOOR, record.lua) rises to the removed event's ver, so
-- that the device, seen anew, starts above it; the removed event is
-- appended.
-- Returns {0, now} when the shard holds no record of the device (nothing
-- written), else {1, now, event} (event as emit returns it).
local G_DEVICE, G_BY, G_NOW, G_MAXLEN = 1, 2, 3, 4

local dev, by = ARGV[G_DEVICE], ARGV[G_BY]
local now = clock(ARGV[G_NOW])
local packed = redis.call('HGET', KEYS[2], dev)
if sub(dev, 1, 1) == INC or not packed then return {0, now} end

local r = decode(packed, false)
local ver = r.ver + 1
local g = believer(packed)
redis.call('HDEL', KEYS[2], dev)
if isonline(packed) then countonline(-1) end -- an offline one counts by HLEN
redis.call('ZREM', KEYS[1], dev)
redis.call('HDEL', KEYS[6], dev)
reindex(dev, packed, nil)
movesessions(sessgws(r), nil)
ixflush()
if g then redis.call('ZADD', KEYS[5], 0, invalidation(g, now, dev)) end
if ver > verfloor() then redis.call('HSET', KEYS[4], VFLOOR, string.format('%d', ver)) end
local ev = emit(dev, 'removed', ver, string.format('%d', now), 'forget', by, r.lastsid)
trim(ARGV[G_MAXLEN])
return {1, now, ev}
