-- release.lua: give leases back, one or a batch of idle ones in one call,
-- and wake waiters everywhere.
--
-- KEYS[1]     leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]     waiters ZSET (only counted, for the reply)
-- KEYS[3..]   the user ZSET of each lease, in the order of the lease ids
-- ARGV[1]     notification channel
-- ARGV[2..]   lease ids
--
-- Publishes once when a live lease was removed: a lease that expired
-- already freed its slot, and its id is never reused by another holder,
-- so releasing it late frees nobody else's slot. Returns {released (how
-- many live leases were removed), in_use, waiters}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local released = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local exp = redis.call('ZSCORE', KEYS[1], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[1 + i], id)
  if exp and tonumber(exp) > now_ms then
    released = released + 1
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if released > 0 then
  redis.call('PUBLISH', ARGV[1], 'released')
end
return {released, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
