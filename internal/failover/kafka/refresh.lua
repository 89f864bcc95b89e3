-- refresh.lua: extend a member's claim on a job, but only while that
-- member still holds it and the job is not done. It never takes a claim
-- back from a member that took the job over. A claim that expired but was
-- not taken over yet is still the member's own and is extended.
--
-- KEYS[1]  claim key (a hash: member, attempt, expires_ms, done)
-- ARGV[1]  member refreshing
-- ARGV[2]  claim ttl in milliseconds
-- ARGV[3]  key retention in milliseconds (longer than the ttl)
--
-- Returns 1 when extended, 0 when the member does not hold the claim.
local f = redis.call('HMGET', KEYS[1], 'member', 'done')
if f[1] ~= ARGV[1] or f[2] == '1' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'expires_ms', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
