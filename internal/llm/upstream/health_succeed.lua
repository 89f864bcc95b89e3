-- health_succeed.lua: record a probe's 2xx or a call's first chunk.
--
-- KEYS[1]  fails counter
-- KEYS[2]  down key
-- KEYS[3]  suspect key
-- KEYS[4]  trial key
-- ARGV[1]  health channel
-- ARGV[2]  upstream name
--
-- Returns 1 when this brought the upstream back from its trial, else 0. A
-- success while the upstream still sits out (a call that began before the
-- ejection) does not end the ejection.
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if redis.call('DEL', KEYS[3]) == 1 then
  redis.call('DEL', KEYS[4])
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
