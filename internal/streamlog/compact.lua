-- KEYS[1]: a finished stream log (streamlog.Key)
-- KEYS[2]: a key beside it on its slot that lives only in this script
-- ARGV[1]: its TTL in milliseconds
-- Rewrites the log in place through COPY and RENAME: the same entries,
-- ids and TTL, without the 4 KB Redis 7.0 preallocates for a stream's
-- listpack node, most of which a short answer leaves unused
-- (docs/bench-history/2026-11.md, "Stream log at load"). COPY allocates
-- each node at its size, a copy of memory where DUMP and RESTORE
-- serialize, checksum and parse (docs/bench-history/2026-11.md, "Stream
-- log, paced"). Returns 1; 0 when the log is gone or the server cannot
-- copy or rename it (a managed Redis may deny either command), which
-- leaves it as it was: compacting is worth memory, never an error.
local ok = redis.pcall('COPY', KEYS[1], KEYS[2], 'REPLACE')
if ok ~= 1 then
  return 0
end
ok = redis.pcall('RENAME', KEYS[2], KEYS[1])
if type(ok) == 'table' and ok.err then
  redis.pcall('DEL', KEYS[2])
  return 0
end
redis.pcall('PEXPIRE', KEYS[1], ARGV[1])
return 1
