-- caps_acquire.lua: take one call slot of a capped upstream, or say it is full.
-- Time comes from Redis TIME so every process agrees on lease expiry.
--
-- KEYS[1]  the upstream's in-flight ZSET: member lease id, score expiry (ms)
-- ARGV[1]  lease id to add when granted (never reused)
-- ARGV[2]  the upstream's max_concurrency
-- ARGV[3]  lease TTL in ms: the lease lives this long unless renewed
--
-- Returns {granted (0 or 1), in_flight afterwards}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

-- Leases of a process that died stop being renewed and drop out here.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local n = redis.call('ZCARD', KEYS[1])
if n >= cap then
  return {0, n}
end
redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 3 * ttl)
return {1, n + 1}
