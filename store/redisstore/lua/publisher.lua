-- Publisher lease and saved position of one shard (Store.AcquirePublisher,
-- SavePublisher, ReleasePublisher).
-- KEYS[1] {P:s}:pub HASH: owner, expiry (ms, store clock), pos (the saved
-- position "<incarnation>@<id>"); the position outlives the lease.
-- ARGV: op ("acquire"|"save"|"release"), owner, ttl ms (acquire) or the
-- position (save), now ms or "".
-- acquire returns {1, pos or ""} when owner now holds the lease, {0} when
-- another owner holds an unexpired one; save returns 1 when it wrote the
-- position (owner holds the lease, expired or not, and no one else took
-- it), else 0; release returns 0.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'expiry', 'pos')
local holder, expiry = cur[1], tonumber(cur[2]) or 0
if ARGV[1] == 'release' then
  if holder == ARGV[2] then redis.call('HDEL', KEYS[1], 'owner', 'expiry') end
  return 0
end
if ARGV[1] == 'save' then
  if holder ~= ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'pos', ARGV[3])
  return 1
end
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if holder and holder ~= ARGV[2] and expiry > now then return {0} end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'expiry', string.format('%d', now + tonumber(ARGV[3])))
return {1, cur[3] or ''}
