-- renew.lua: extend every lease and waiter one process holds, in one call.
-- A lease or waiter that expired (its process was stalled longer than the
-- TTL) is not revived: its slot may have gone to someone else.
--
-- KEYS[1]     leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]     waiters ZSET: member waiter id, score enqueue time (µs)
-- KEYS[3]     waiter expiry ZSET: member waiter id, score expiry (ms)
-- KEYS[4..]   the user ZSET of each lease, in the order of the lease ids
-- ARGV[1]     TTL in ms
-- ARGV[2]     n, the number of lease ids
-- ARGV[3..2+n]  lease ids
-- ARGV[3+n..]   waiter members
--
-- Returns {in_use, lost lease ids, lost waiter members}; in_use counts live
-- leases of the whole pool.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local exp = now_ms + ttl
local keep = 3 * ttl

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local lost_leases, lost_waiters = {}, {}
for i = 1, n do
  local id, ukey = ARGV[2 + i], KEYS[3 + i]
  if redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], 'XX', exp, id)
    redis.call('ZADD', ukey, exp, id)
    redis.call('PEXPIRE', ukey, keep)
  else
    redis.call('ZREM', ukey, id)
    lost_leases[#lost_leases + 1] = id
  end
end
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], keep)
end

local refreshed = false
for i = 3 + n, #ARGV do
  local m = ARGV[i]
  local e = redis.call('ZSCORE', KEYS[3], m)
  if e and tonumber(e) > now_ms and redis.call('ZSCORE', KEYS[2], m) then
    redis.call('ZADD', KEYS[3], 'XX', exp, m)
    refreshed = true
  else
    redis.call('ZREM', KEYS[2], m)
    redis.call('ZREM', KEYS[3], m)
    lost_waiters[#lost_waiters + 1] = m
  end
end
if refreshed then
  redis.call('PEXPIRE', KEYS[2], keep)
  redis.call('PEXPIRE', KEYS[3], keep)
end
return {redis.call('ZCARD', KEYS[1]), lost_leases, lost_waiters}
