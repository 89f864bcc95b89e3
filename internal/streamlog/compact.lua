-- KEYS[1]: a finished stream log (streamlog.Key)
-- ARGV[1]: its TTL in milliseconds
-- Rewrites the log in place through DUMP and RESTORE: the same entries,
-- ids and TTL, without the 4 KB Redis 7.0 preallocates for a stream's
-- listpack node, most of which a short answer leaves unused
-- (docs/BENCHMARKS.md, "Stream log at load"). Returns 1, or 0 when the
-- log is gone.
local dump = redis.call('DUMP', KEYS[1])
if not dump then
  return 0
end
redis.call('RESTORE', KEYS[1], ARGV[1], dump, 'REPLACE')
return 1
