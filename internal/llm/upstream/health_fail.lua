-- health_fail.lua: record a retryable failure before the first chunk, and
-- eject the upstream when it is one too many.
--
-- KEYS[1]  fails counter (consecutive failures, cluster-wide)
-- KEYS[2]  down key: exists while the upstream sits out, value the reason
-- KEYS[3]  suspect key: from ejection until a trial or probe succeeds
-- KEYS[4]  trial key: held by the one caller trying the upstream
-- ARGV[1]  max fails (LLM_UPSTREAM_MAX_FAILS)
-- ARGV[2]  cooldown in ms (LLM_UPSTREAM_COOLDOWN_SECONDS)
-- ARGV[3]  sit out this many ms at once (a 429's Retry-After), or 0
-- ARGV[4]  "1" when the failed call was the trial or a probe of a suspect
-- ARGV[5]  reason, kept as the down key's value
-- ARGV[6]  health channel, told the upstream's name on ejection
-- ARGV[7]  upstream name
--
-- Returns {ejected (0 or 1), consecutive failures}. An upstream already
-- sitting out is left alone: calls that started before its ejection fail
-- too, and must not extend it.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0}
end
local cooldown = tonumber(ARGV[2])
local sit_out = tonumber(ARGV[3])
if sit_out <= 0 then
  if ARGV[4] ~= '1' and redis.call('EXISTS', KEYS[3]) == 0 then
    local n = redis.call('INCR', KEYS[1])
    -- Failures spread over more than a few cooldowns are not consecutive.
    redis.call('PEXPIRE', KEYS[1], 10 * cooldown)
    if n < tonumber(ARGV[1]) then
      return {0, n}
    end
  end
  sit_out = cooldown
end
redis.call('SET', KEYS[2], ARGV[5], 'PX', sit_out)
-- The suspect mark outlives the ejection by a day, so a removed upstream's
-- keys do not stay forever.
redis.call('SET', KEYS[3], '1', 'PX', sit_out + 86400000)
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return {1, 0}
