-- quota_release.lua: uncount a job that left the queue (started, expired,
-- cancelled). Releasing twice, or after expiry, changes nothing.
--
-- KEYS[1]  the identity's ZSET (see quota_reserve.lua)
-- KEYS[2]  every queued job's ZSET
-- KEYS[3]  HASH request id -> bytes
-- KEYS[4]  STRING total bytes
-- ARGV[1]  request id
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  local b = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('DECRBY', KEYS[4], b)
end
return 0
