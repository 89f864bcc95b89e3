-- caps_release.lua: give a call slot back and tell every process.
--
-- KEYS[1]  the upstream's in-flight ZSET: member lease id, score expiry (ms)
-- ARGV[1]  lease id
-- ARGV[2]  notification channel
-- ARGV[3]  upstream name, published with the new count
--
-- Publishes "<count> <name>" only when a live lease was removed: an expired
-- lease already freed its slot. Returns {released (0 or 1), in_flight}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local n = redis.call('ZCARD', KEYS[1])
if exp and tonumber(exp) > now_ms then
  redis.call('PUBLISH', ARGV[2], n .. ' ' .. ARGV[3])
  return {1, n}
end
return {0, n}
