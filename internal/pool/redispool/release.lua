-- release.lua: give a lease back and wake waiters everywhere.
--
-- KEYS[1]  leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]  the lease's user ZSET
-- ARGV[1]  lease id
-- ARGV[2]  notification channel
--
-- Publishes only when a live lease was removed: a lease that expired
-- already freed its slot, and its id is never reused, so releasing it late
-- frees nobody else's slot. Returns {released (0 or 1), in_use}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local released = 0
if exp and tonumber(exp) > now_ms then
  released = 1
  redis.call('PUBLISH', ARGV[2], 'released')
end
return {released, redis.call('ZCARD', KEYS[1])}
