-- adapt.lua: apply one process's report to a named adaptive limit
-- (AIMD), the same rule as adaptive.State.Apply. Time comes from Redis
-- TIME, so every process paces the one limit by the same clock.
--
-- KEYS[1]  the limit's HASH: limit, window_start (ms), calls, throttled
--          (0|1), last_decrease (ms, absent: never)
-- ARGV[1]  floor (ADAPTIVE_CONCURRENCY_FLOOR)
-- ARGV[2]  ceiling (CONNECTION_POOL_SIZE), also the start
-- ARGV[3]  interval in ms (ADAPTIVE_INTERVAL_MS)
-- ARGV[4]  calls ended since this process's previous report
-- ARGV[5]  "1" when the provider throttled (429/503, or a slow first-token
--          p99), else "0"
-- ARGV[6]  notification channel of the pool: a limit that grew wakes the
--          waiters of every process
-- ARGV[7]  TTL of the hash in ms, refreshed by every report
-- ARGV[8]  reclaim channel of the pool (optional): a limit that fell asks
--          every process to give back the idle leases it keeps
--
-- The interval running when the report arrives is closed first if it has
-- run its course: +1 when it had calls and no throttle (the report's calls
-- count in it). Then a throttle marks the interval and halves the limit,
-- at most once per interval. Returns the limit.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor = tonumber(ARGV[1])
local ceiling = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])

local h = redis.call('HMGET', KEYS[1], 'limit', 'window_start', 'calls', 'throttled', 'last_decrease')
local limit = tonumber(h[1])
local window_start = tonumber(h[2])
if limit == nil or window_start == nil then
  limit, window_start = ceiling, now
end
limit = math.min(math.max(limit, floor), ceiling)
local before = limit
local calls = (tonumber(h[3]) or 0) + tonumber(ARGV[4])
local throttled = tonumber(h[4]) or 0
local last_decrease = tonumber(h[5])

local grew = false
if now >= window_start + interval then
  if calls > 0 and throttled == 0 and limit < ceiling then
    limit = limit + 1
    grew = true
  end
  window_start, calls, throttled = now, 0, 0
end
if ARGV[5] == '1' then
  throttled = 1
  if last_decrease == nil or now >= last_decrease + interval then
    limit = math.max(floor, math.floor(limit / 2))
    last_decrease = now
  end
end

redis.call('HSET', KEYS[1], 'limit', limit, 'window_start', window_start, 'calls', calls, 'throttled', throttled)
if last_decrease ~= nil then
  redis.call('HSET', KEYS[1], 'last_decrease', last_decrease)
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if grew then
  redis.call('PUBLISH', ARGV[6], 'grown')
end
if limit < before and (ARGV[8] or '') ~= '' then
  redis.call('PUBLISH', ARGV[8], 'shrunk')
end
return limit
