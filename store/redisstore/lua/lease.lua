-- Runner lease of one shard (Store.AcquireShard / ReleaseShard).
-- KEYS[1] {P:s}:runner = "<expiry ms> <owner>", judged on the store clock
-- (Redis TIME, or the test clock's now) and also set to expire with PX
-- after the ttl.
-- ARGV: op ("acquire"|"release"), owner, ttl ms, now ms or "".
-- acquire returns 1 when owner now holds the lease, 0 when another owner
-- holds an unexpired one; release deletes the lease only if owner holds it.
local cur = redis.call('GET', KEYS[1])
local holder, expiry = nil, 0
if cur then
  local sp = string.find(cur, ' ', 1, true)
  expiry, holder = tonumber(string.sub(cur, 1, sp - 1)), string.sub(cur, sp + 1)
end
if ARGV[1] == 'release' then
  if holder == ARGV[2] then redis.call('DEL', KEYS[1]) end
  return 0
end
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if holder and holder ~= ARGV[2] and expiry > now then return 0 end
redis.call('SET', KEYS[1], string.format('%d', now + tonumber(ARGV[3])) .. ' ' .. ARGV[2], 'PX', ARGV[3])
return 1
