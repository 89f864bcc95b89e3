-- ack.lua: acknowledge and delete one pending entry, but only while this
-- consumer holds it: a worker that stalled past the reclaim time must not
-- delete the entry its successor is answering (docs/QUEUE.md, "Fencing and
-- gaps"). The owner is checked, not the delivery count: a member that takes
-- its own running entry back keeps the running answer (the worker drops the
-- copy), and miniredis counts a refresh as a delivery.
--
-- KEYS[1]  stream key
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  entry id
--
-- Returns 1 when acknowledged, 0 when the entry is not pending (already
-- acknowledged: a retried call after a lost reply), -1 when another
-- consumer holds it.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 then
  return 0
end
if p[1][2] ~= ARGV[2] then
  return -1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
return 1
