-- leave.lua: withdraw a waiter that gave up, and wake the others when
-- that may hand them a free slot.
--
-- KEYS[1]  waiters ZSET: member waiter id, score enqueue time (µs)
-- KEYS[2]  waiter expiry ZSET: member waiter id, score expiry (ms)
-- KEYS[3]  leases ZSET: member lease id, score expiry (ms)
-- ARGV[1]  waiter member
-- ARGV[2]  notification channel
-- ARGV[3]  global size
--
-- Returns 1 when the waiter was registered, else 0.
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if n > 0 and redis.call('ZCARD', KEYS[3]) < tonumber(ARGV[3]) then
  redis.call('PUBLISH', ARGV[2], 'left')
end
return n
