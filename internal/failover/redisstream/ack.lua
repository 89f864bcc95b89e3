-- ack.lua: acknowledge and delete pending entries of one shard, each only
-- while this consumer holds it: a worker that stalled past the reclaim time
-- must not delete the entry its successor is answering (docs/QUEUE.md,
-- "Fencing and gaps"). The owner is checked, not the delivery count: a
-- member that takes its own running entry back keeps the running answer
-- (the worker drops the copy), and miniredis counts a refresh as a
-- delivery. Many jobs' acknowledgements share one call (acker.go); each
-- entry is checked and settled on its own, as one call each would.
--
-- KEYS[k]    the shard's job streams the entries are in (one Cluster slot)
-- ARGV[1]    consumer group
-- ARGV[2]    consumer name
-- ARGV[2+2i-1], ARGV[2+2i]  entry i: the index k of its stream in KEYS,
--            its entry id
--
-- Returns one code an entry, in order: 1 when acknowledged, 0 when the
-- entry is not pending (already acknowledged: a retried call after a lost
-- reply), -1 when another consumer holds it.
local group, consumer = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 2 do
  local key, id = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local p = redis.call('XPENDING', key, group, id, id, 1)
  if #p == 0 then
    out[#out + 1] = 0
  elseif p[1][2] ~= consumer then
    out[#out + 1] = -1
  else
    redis.call('XACK', key, group, id)
    redis.call('XDEL', key, id)
    out[#out + 1] = 1
  end
end
return out
