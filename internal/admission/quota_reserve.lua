-- quota_reserve.lua: count one queued job against its identity and the
-- backlog's bytes, or say which bound refuses it. Time comes from Redis
-- TIME so every api process agrees on when an entry has expired.
--
-- KEYS[1]  the identity's ZSET: member request id, score deadline (ms)
-- KEYS[2]  every queued job's ZSET: member request id, score deadline (ms)
-- KEYS[3]  HASH request id -> bytes of its job
-- KEYS[4]  STRING total bytes of the jobs in KEYS[2]
-- ARGV[1]  request id
-- ARGV[2]  bytes of the job
-- ARGV[3]  longest wait in ms: the entry expires by itself after it, so an
--          api that died before releasing leaks nothing for longer
-- ARGV[4]  most jobs per identity (QUEUE_MAX_PER_IDENTITY)
-- ARGV[5]  most bytes in all (QUEUE_MAX_BYTES)
-- Returns 0 when counted, 1 when the identity is at its limit, 2 when the
-- bytes would exceed the bound.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Expire a bounded batch of entries that outlived their deadline.
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  local b = tonumber(redis.call('HGET', KEYS[3], id) or '0')
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('DECRBY', KEYS[4], b)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 1
end
local total = tonumber(redis.call('GET', KEYS[4]) or '0')
if total + tonumber(ARGV[2]) > tonumber(ARGV[5]) then
  return 2
end

local wait = tonumber(ARGV[3])
local deadline = now + wait
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
-- No entry of the identity outlives this, so neither need its key.
redis.call('PEXPIRE', KEYS[1], wait)
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[4], ARGV[2])
-- The shared keys live as long as their latest entry, never less: they
-- vanish together once the queue has been idle for a wait, so nothing of
-- the quota stays in Redis for ever. Only ever lengthened, as another api
-- may wait longer.
for i = 2, 4 do
  if redis.call('PTTL', KEYS[i]) < wait then
    redis.call('PEXPIRE', KEYS[i], wait)
  end
end
return 0
