-- dead_letter.lua: move one pending entry to the dead-letter stream,
-- atomically and at most once.
-- The record is written before the entry is acknowledged, so a failing
-- XADD (e.g. OOM) leaves the job pending instead of losing it. An entry
-- that is no longer pending (already acknowledged or dead-lettered) is not
-- recorded again, so a retried call after a lost reply is harmless.
--
-- KEYS[1]  stream key
-- KEYS[2]  dead-letter stream key (same Cluster slot as KEYS[1])
-- ARGV[1]  consumer group
-- ARGV[2]  entry id
-- ARGV[3]  reason
-- ARGV[4]  attempt
-- ARGV[5]  consumer name
-- ARGV[6]  maximum length of the dead-letter stream (XADD MAXLEN ~)
-- ARGV[7]  seconds the dead-letter stream lives after this record
-- ARGV[8]  '1' to keep the body; else body_sha1 and body_bytes only
-- ARGV[9]  replays: how often the job's prompt was replayed and failed
--          again ('0' for a job that is no replay)
-- ARGV[10] the dead-letter entry this one replaces (a failed replay's
--          original, in KEYS[2]), or '' for none: deleted with the write
--
-- Returns 1 when recorded, 0 when the entry was not pending, -1 when
-- another consumer holds it (fenced off, like ack.lua).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then
  return 0
end
if p[1][2] ~= ARGV[5] then
  return -1
end
local request_id, body = '', ''
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #e > 0 then
  local f = e[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'request_id' then
      request_id = f[i + 1]
    elseif f[i] == 'body' then
      body = f[i + 1]
    end
  end
end
local t = redis.call('TIME')
local failed_at_ms = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
local kept = body
if ARGV[8] ~= '1' then
  kept = ''
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*',
  'request_id', request_id, 'body', kept, 'body_sha1', redis.sha1hex(body),
  'body_bytes', tostring(#body), 'reason', ARGV[3],
  'attempt', ARGV[4], 'source_id', ARGV[2], 'failed_at_ms', failed_at_ms,
  'replays', ARGV[9])
if ARGV[10] ~= '' then
  redis.call('XDEL', KEYS[2], ARGV[10])
end
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
