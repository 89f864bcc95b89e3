-- recent_add.lua: add one process's counts to the current bucket of the
-- cluster-wide last minute (the degradation level's queue waits and
-- ended requests). Time comes from Redis TIME, so every process fills the
-- same bucket.
--
-- KEYS[1]  recent HASH: field "<bucket start ms>:<counter>" → count
-- ARGV[1]  bucket width in ms
-- ARGV[2]  TTL of the hash in ms, refreshed by every add
-- ARGV[3…] pairs: counter name, amount to add
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local width = tonumber(ARGV[1])
local bucket = now_ms - now_ms % width
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], bucket .. ':' .. ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return bucket
