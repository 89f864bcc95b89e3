-- quota_release.lua: uncount jobs that left the queue (started, expired,
-- cancelled), one or many in one call. Releasing twice, or after expiry,
-- changes nothing.
--
-- KEYS[1]    every queued job's ZSET (see quota_reserve.lua)
-- KEYS[2]    HASH request id -> bytes
-- KEYS[3]    STRING total bytes
-- KEYS[3+i]  the ZSET of the identity of job i
-- ARGV[i]    request id of job i
for i, id in ipairs(ARGV) do
  redis.call('ZREM', KEYS[3 + i], id)
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local b = tonumber(redis.call('HGET', KEYS[2], id) or '0')
    redis.call('HDEL', KEYS[2], id)
    redis.call('DECRBY', KEYS[3], b)
  end
end
return 0
