-- Runner lease of one shard (Store.AcquireShard / ReleaseShard).
-- KEYS[1] {P:s}:runner. ARGV: op ("acquire"|"release"), owner, ttl ms.
-- acquire returns 1 when owner now holds the lease, 0 when another does;
-- release deletes the lease only if owner holds it.
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == 'release' then
  if cur == ARGV[2] then redis.call('DEL', KEYS[1]) end
  return 0
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if cur == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
