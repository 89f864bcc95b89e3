-- KEYS[1]: a finished stream log (streamlog.Key)
-- ARGV[1]: its TTL in milliseconds
-- Rewrites the log in place through DUMP and RESTORE: the same entries,
-- ids and TTL, without the 4 KB Redis 7.0 preallocates for a stream's
-- listpack node, most of which a short answer leaves unused
-- (docs/BENCHMARKS.md, "Stream log at load"). Returns 1; 0 when the log
-- is gone or the server cannot dump or restore it (miniredis dumps only
-- strings; a managed Redis may deny either command), which leaves it as
-- it was: compacting is worth memory, never an error.
local dump = redis.pcall('DUMP', KEYS[1])
if type(dump) ~= 'string' then
  return 0
end
local ok = redis.pcall('RESTORE', KEYS[1], ARGV[1], dump, 'REPLACE')
if type(ok) == 'table' and ok.err then
  return 0
end
return 1
