-- touch.lua: restart the idle time of one pending entry, but only while
-- this consumer still holds it, and without counting a new delivery.
-- A plain XCLAIM would take the entry back from a member that already took
-- it over; RETRYCOUNT keeps the delivery count where it is on servers that
-- would bump it (miniredis ignores JUSTID for that).
--
-- KEYS[1]  stream key
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  entry id
--
-- Returns 1 when refreshed, 0 when the entry is not pending (acknowledged,
-- dead-lettered or lost), -1 when another consumer holds it.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 then
  return 0
end
if p[1][2] ~= ARGV[2] then
  return -1
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', p[1][4], 'JUSTID')
return 1
