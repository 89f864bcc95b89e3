-- release.lua: record a job done, but only for the member that holds its
-- claim: a worker that stalled past the claim's expiry, whose job another
-- member took over, must not finish the job its successor is answering
-- (the Kafka side of ack.lua on Redis Streams). A job already done stays
-- done, so a call retried after a lost reply is harmless; a job without a
-- record (it expired, or Redis lost it) is recorded done.
--
-- KEYS[1]  claim key (a hash: member, attempt, expires_ms, done)
-- ARGV[1]  member releasing
-- ARGV[2]  key retention in milliseconds
--
-- Returns 1 when the job is recorded done, 0 when another member holds
-- the claim.
local f = redis.call('HMGET', KEYS[1], 'member', 'done')
if f[2] ~= '1' then
  if f[1] and f[1] ~= ARGV[1] then
    return 0
  end
  redis.call('HSET', KEYS[1], 'done', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
