-- claim.lua: take the claim on one job for a member. A job nobody claimed
-- yet starts at attempt 1; the member that holds the claim keeps its
-- attempt (the call is idempotent); a claim whose holder let it expire is
-- taken over and the attempt grows by one. A live claim of another member
-- and a finished job are reported, not touched. Time is Redis TIME, so
-- clients with skewed clocks agree on expiry.
--
-- KEYS[1]  claim key (a hash: member, attempt, expires_ms, done)
-- ARGV[1]  member claiming
-- ARGV[2]  claim ttl in milliseconds
-- ARGV[3]  key retention in milliseconds (longer than the ttl)
--
-- Returns {1, attempt} when ARGV[1] holds the claim now, {0, attempt} when
-- another member holds a live claim, {2, attempt} when the job is done.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 'member', 'attempt', 'expires_ms', 'done')
local attempt = tonumber(f[2]) or 0
if f[4] == '1' then
  return {2, attempt}
end
if f[1] and f[1] ~= ARGV[1] and (tonumber(f[3]) or 0) > now then
  return {0, attempt}
end
if f[1] ~= ARGV[1] then
  attempt = attempt + 1
end
redis.call('HSET', KEYS[1], 'member', ARGV[1], 'attempt', attempt, 'expires_ms', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, attempt}
