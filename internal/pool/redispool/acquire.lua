-- acquire.lua: take one slot of the distributed pool, or say why not.
-- Time comes from Redis TIME so every process agrees on lease expiry.
--
-- KEYS[1]  leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]  the requesting user's ZSET: same members and scores as KEYS[1]
-- KEYS[3]  waiters ZSET: member waiter id, score enqueue time (µs)
-- KEYS[4]  waiter expiry ZSET: member waiter id, score expiry (ms)
-- KEYS[5]  the adaptive limit's HASH (adapt.lua), read with ARGV[8]
-- KEYS[6]  optional: the user ZSET of the idle lease ARGV[10]
-- ARGV[1]  lease id to add when granted
-- ARGV[2]  global size (CONNECTION_POOL_SIZE)
-- ARGV[3]  per-user limit (CONNECTION_POOL_PER_USER)
-- ARGV[4]  lease TTL in ms; waiters live as long unless refreshed
-- ARGV[5]  user key prefix: a user's ZSET is ARGV[5]..user (KEYS[2] is
--          one). The sets of other waiting users are read by that name
--          without being declared: they share the {pool} hash tag, so they
--          are in the declared keys' cluster slot.
-- ARGV[6]  "" for a direct request (TryAcquire); else this waiter's member,
--          16 id characters, ":", then the user.
-- ARGV[7]  the waiter's place in line (µs since the epoch): when its work
--          was queued; 0 means now (Redis TIME).
-- ARGV[8]  "1" when adaptive concurrency is on: the global size is then
--          lowered to the `limit` field of KEYS[5] (adapt.lua keeps it),
--          when that exists and is lower. Else "0" and KEYS[5] is not read.
-- ARGV[9]  reclaim channel (ReclaimChannel): asks every process to give
--          back the idle leases it keeps (idle.go). Published to when a
--          new waiter stays in line ("waiting"), when a direct request
--          finds no free slot ("full") or its user at the limit
--          ("user:"..user). "" publishes nothing.
-- ARGV[10] optional: an idle lease of another user that this process
--          gives back in the same call (idle.go, "swap"), before the
--          request is judged; its slot then counts as free.
-- ARGV[11] notification channel, told when that idle lease was live
--
-- Fairness: a waiter is eligible when its user has a free per-user slot;
-- of several waiters of one user only as many as it has free slots count.
-- A direct request is refused (code 3) while the eligible waiters are at
-- least as many as the free slots. A waiter is granted only when fewer
-- than `free` eligible waiters come before it in round-robin order between
-- users (the user with fewest live leases first), FIFO within one user.
--
-- Returns {code, in_use, enqueued, size, waiters}: code 0 granted, 1 pool
-- exhausted (or, for a waiter, free slots belong to older waiters), 2 user
-- limit, 3 free slots belong to waiters; in_use counts live leases
-- afterwards; enqueued is the waiter's score (0 for a direct request);
-- size is the global size applied (lowered by the adaptive limit);
-- waiters counts the registered waiters afterwards. A refused waiter
-- stays registered (registered now if it was not).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local size = tonumber(ARGV[2])
if ARGV[8] == '1' then
  local adaptive = tonumber(redis.call('HGET', KEYS[5], 'limit'))
  if adaptive ~= nil and adaptive < size then
    size = math.max(adaptive, 1)
  end
end
local per_user = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local user_prefix = ARGV[5]
local waiter = ARGV[6]
local keep = 3 * ttl
local reclaim = ARGV[9] or ''

local function notify(what)
  if reclaim ~= '' then
    redis.call('PUBLISH', reclaim, what)
  end
end

local swap = ARGV[10] or ''
if swap ~= '' and KEYS[6] ~= nil then
  local exp = redis.call('ZSCORE', KEYS[1], swap)
  redis.call('ZREM', KEYS[1], swap)
  redis.call('ZREM', KEYS[6], swap)
  if exp and tonumber(exp) > now_ms and (ARGV[11] or '') ~= '' then
    redis.call('PUBLISH', ARGV[11], 'released')
  end
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
-- Waiters of a process that stopped refreshing them (it died).
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 1000)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREM', KEYS[4], unpack(gone))
end

local in_use = redis.call('ZCARD', KEYS[1])
local free = size - in_use
local user_used = redis.call('ZCARD', KEYS[2])

-- How many of members (oldest first) could take a slot now, counting at
-- most limit. Other users' sets are counted, not purged (read-only).
local function eligible(members, limit)
  local n, room = 0, {}
  for _, m in ipairs(members) do
    local u = string.sub(m, 18)
    local r = room[u]
    if r == nil then
      r = per_user - redis.call('ZCOUNT', user_prefix .. u, '(' .. now_ms, '+inf')
    end
    if r > 0 then
      n = n + 1
      r = r - 1
    end
    room[u] = r
    if n >= limit then
      break
    end
  end
  return n
end

local function grant(enqueued)
  local exp = now_ms + ttl
  redis.call('ZADD', KEYS[1], exp, ARGV[1])
  redis.call('ZADD', KEYS[2], exp, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
  return {0, in_use + 1, enqueued, size, redis.call('ZCARD', KEYS[3])}
end

local function refuse(code, enqueued)
  return {code, in_use, enqueued, size, redis.call('ZCARD', KEYS[3])}
end

if waiter == '' then
  if free <= 0 then
    notify('full')
    return refuse(1, 0)
  end
  if user_used >= per_user then
    notify('user:' .. string.sub(KEYS[2], #user_prefix + 1))
    return refuse(2, 0)
  end
  if redis.call('ZCARD', KEYS[3]) >= free then
    if eligible(redis.call('ZRANGE', KEYS[3], 0, -1), free) >= free then
      return refuse(3, 0)
    end
  end
  return grant(0)
end

local enqueued = redis.call('ZSCORE', KEYS[3], waiter)
local registered_now = false
if enqueued then
  enqueued = tonumber(enqueued)
else
  registered_now = true
  enqueued = tonumber(ARGV[7])
  if enqueued == nil or enqueued <= 0 then
    enqueued = now_us
  end
  redis.call('ZADD', KEYS[3], enqueued, waiter)
end
redis.call('ZADD', KEYS[4], now_ms + ttl, waiter)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)

-- A waiter that stays in line tells every process to give back its idle
-- leases (once, when it registers).
local function wait(code)
  if registered_now then
    notify('waiting')
  end
  return refuse(code, enqueued)
end

if user_used >= per_user then
  return wait(2)
end
if free <= 0 then
  return wait(1)
end
-- Round-robin between users, FIFO within one: a waiter's turn key is its
-- user's live leases plus the number of that user's waiters older than it,
-- so the user holding fewest slots goes first, ties to the oldest waiter.
-- A waiter is eligible while its key is below the per-user limit. This one
-- is granted when fewer than `free` eligible waiters come before it.
local members = redis.call('ZRANGE', KEYS[3], 0, -1)
local used, seen, keys = {}, {}, {}
local mine_k, mine_pos = nil, nil
for i, m in ipairs(members) do
  local u = string.sub(m, 18)
  if used[u] == nil then
    used[u] = redis.call('ZCOUNT', user_prefix .. u, '(' .. now_ms, '+inf')
    seen[u] = 0
  end
  keys[i] = used[u] + seen[u]
  seen[u] = seen[u] + 1
  if m == waiter then
    mine_k, mine_pos = keys[i], i
  end
end
local ahead = 0
for i, k in ipairs(keys) do
  if i ~= mine_pos and k < per_user and (k < mine_k or (k == mine_k and i < mine_pos)) then
    ahead = ahead + 1
    if ahead >= free then
      return wait(1)
    end
  end
end
redis.call('ZREM', KEYS[3], waiter)
redis.call('ZREM', KEYS[4], waiter)
return grant(enqueued)
