-- next.lua: the next jobs of one shard in priority order, taken for this
-- consumer or only looked at (docs/QUEUE.md, "Priority order").
--
-- KEYS[1]  the shard's job stream of priority low
-- KEYS[2]  … of priority normal
-- KEYS[3]  … of priority high (all three in one Cluster slot)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  how many jobs at most
-- ARGV[4]  PRIORITY_AGING_SECONDS in ms
-- ARGV[5]  "take": deliver the jobs to the consumer (XREADGROUP) and
--          return their bodies; "peek": deliver nothing, return their
--          places in line
-- ARGV[6]  the cancel key's prefix (QUEUE_PREFIX), or empty: with one,
--          "take" also looks up each taken job's cancel key
--          (<prefix>cancel:{<request_id>}, docs/QUEUE.md,
--          "Cancellation"), so the worker need not ask before calling the
--          provider. Only on a single Redis: the key is not declared and
--          on a Cluster lives in another slot.
--
-- The jobs waiting are the entries after the group's last-delivered id:
-- acknowledged entries are deleted and nothing is trimmed. A job's place
-- in line is its entry time (the id's milliseconds, Redis time at XADD)
-- plus the aging for low, less it for high: so a job counts one level
-- higher for each aging period it has waited, and FIFO holds within a
-- priority. The lines are merged by place, ties to the older entry, then
-- to the higher priority.
--
-- Returns the list of jobs, each {rank (0 low, 1 normal, 2 high), entry
-- id, body ("take") or place in ms ("peek"), cancelled ("take" with a
-- cancel prefix: 1 when the job's cancel key exists, 0 when not, -1 when
-- the entry names no request id; else -1)}, in order; empty when none
-- waits. A missing stream or group is an error starting NOGROUP, so the
-- caller recreates them.
local group, consumer = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3])
local aging = tonumber(ARGV[4])
local take = ARGV[5] == 'take'
local cancel_prefix = ARGV[6] or ''

local function last_delivered(key)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then
    return nil
  end
  for _, g in ipairs(groups) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then
        name = g[i + 1]
      elseif g[i] == 'last-delivered-id' then
        last = g[i + 1]
      end
    end
    if name == group then
      return last
    end
  end
  return nil
end

-- Each line's jobs are read one at a time from the group's position, so
-- no more bodies are copied than jobs are chosen.
local lines = {}
for rank = 0, 2 do
  local key = KEYS[rank + 1]
  local last = last_delivered(key)
  if last == nil then
    return redis.error_reply('NOGROUP group ' .. group .. ' or stream ' .. key .. ' missing')
  end
  lines[rank] = {key = key, cursor = last, offset = (1 - rank) * aging, taken = 0}
end

-- head returns the next waiting job of line l, or nil.
local function head(l)
  if l.head == nil and not l.done then
    local e = redis.call('XRANGE', l.key, '(' .. l.cursor, '+', 'COUNT', 1)[1]
    if e == nil then
      l.done = true
    else
      local ms = tonumber(string.match(e[1], '^(%d+)'))
      l.cursor = e[1]
      l.head = {id = e[1], ms = ms, place = ms + l.offset}
    end
  end
  return l.head
end

-- Merge: repeatedly the best head of the three lines.
local order = {}
while #order < want do
  local best, bj = nil, nil
  for rank = 2, 0, -1 do
    local j = head(lines[rank])
    if j ~= nil and (bj == nil or j.place < bj.place or (j.place == bj.place and j.ms < bj.ms)) then
      best, bj = rank, j
    end
  end
  if best == nil then
    break
  end
  order[#order + 1] = {best, bj}
  lines[best].head = nil
  lines[best].taken = lines[best].taken + 1
end

local out = {}
if not take then
  for i, o in ipairs(order) do
    out[i] = {o[1], o[2].id, o[2].place, -1}
  end
  return out
end

-- Deliver: the first `taken` jobs of a line are exactly what XREADGROUP
-- hands out next, the script being atomic.
local bodies, cancelled = {}, {}
for rank = 0, 2 do
  local l = lines[rank]
  if l.taken > 0 then
    local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', l.taken, 'STREAMS', l.key, '>')
    for _, e in ipairs(r[1][2]) do
      local body, rid = '', nil
      local f = e[2]
      for i = 1, #f, 2 do
        if f[i] == 'body' then
          body = f[i + 1]
        elseif f[i] == 'request_id' then
          rid = f[i + 1]
        end
      end
      bodies[e[1]] = body
      local gone = -1
      if cancel_prefix ~= '' and rid ~= nil and rid ~= '' then
        gone = redis.call('EXISTS', cancel_prefix .. 'cancel:{' .. rid .. '}')
      end
      cancelled[e[1]] = gone
    end
  end
end
for i, o in ipairs(order) do
  out[i] = {o[1], o[2].id, bodies[o[2].id] or '', cancelled[o[2].id] or -1}
end
return out
