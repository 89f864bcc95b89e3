-- caps_renew.lua: extend every call slot one process holds, on every
-- upstream, in one call, and report each upstream's count.
-- A lease that expired already (its process stalled longer than the TTL)
-- is not revived: its slot may have gone to someone else.
--
-- KEYS[1..n]  the in-flight ZSET of each capped upstream
-- ARGV[1]     lease TTL in ms
-- ARGV[2..n+1]  how many lease ids follow for KEYS[1], KEYS[2], ...
-- ARGV[n+2..]   the lease ids, grouped by key in KEYS order
--
-- Returns {counts, lost}: counts[i] is KEYS[i]'s live leases afterwards,
-- lost lists the ids that had expired.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local nkeys = #KEYS
local pos = nkeys + 2
local counts, lost = {}, {}
for k = 1, nkeys do
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now_ms)
  local m = tonumber(ARGV[1 + k])
  for _ = 1, m do
    local id = ARGV[pos]
    pos = pos + 1
    if redis.call('ZSCORE', KEYS[k], id) then
      redis.call('ZADD', KEYS[k], 'XX', now_ms + ttl, id)
    else
      lost[#lost + 1] = id
    end
  end
  if m > 0 then
    redis.call('PEXPIRE', KEYS[k], 3 * ttl)
  end
  counts[k] = redis.call('ZCARD', KEYS[k])
end
return {counts, lost}
