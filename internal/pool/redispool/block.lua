-- block.lua: one call for a block of direct requests (TryAcquire, and a
-- waiter's first try) and of leases given back (docs/OPERATIONS.md, "Slot
-- blocks"): the leases are removed first, then each request is judged in
-- order by acquire.lua's rules for a direct request. Time comes from Redis
-- TIME.
--
-- KEYS[1]          leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]          waiters ZSET: member waiter id, score enqueue time (µs)
-- KEYS[3]          waiter expiry ZSET: member waiter id, score expiry (ms)
-- KEYS[4]          the adaptive limit's HASH, read when ARGV[5] is "1"
-- KEYS[5..4+r]     the user ZSET of each lease given back, in order
-- KEYS[5+r..]      the user ZSET of each request, in order
-- ARGV[1]          global size (CONNECTION_POOL_SIZE)
-- ARGV[2]          per-user limit (CONNECTION_POOL_PER_USER)
-- ARGV[3]          lease TTL in ms
-- ARGV[4]          user key prefix: a user's ZSET is ARGV[4]..user. The
--                  sets of waiting users are read by that name without
--                  being declared: they share the {pool} hash tag.
-- ARGV[5]          "1" when adaptive concurrency is on (acquire.lua ARGV[8])
-- ARGV[6]          reclaim channel (acquire.lua ARGV[9]); "" publishes nothing
-- ARGV[7]          notification channel, told when a live lease was given back
-- ARGV[8]          r, the number of leases given back
-- ARGV[9..8+r]     the lease ids given back
-- ARGV[9+r..]      one new lease id per request, added when granted
--
-- Returns {in_use, size, waiters, released, code_1, …, code_n}: in_use
-- counts live leases afterwards, size is the global size applied, waiters
-- the registered waiters, released how many live leases were removed;
-- code_i is request i's acquire.lua code for a direct request (0 granted,
-- 1 pool exhausted, 2 user limit, 3 free slots belong to waiters).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local size = tonumber(ARGV[1])
if ARGV[5] == '1' then
  local adaptive = tonumber(redis.call('HGET', KEYS[4], 'limit'))
  if adaptive ~= nil and adaptive < size then
    size = math.max(adaptive, 1)
  end
end
local per_user = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local user_prefix = ARGV[4]
local reclaim = ARGV[6]
local r = tonumber(ARGV[8])
local n = #ARGV - 8 - r
local keep = 3 * ttl

local released = 0
for i = 1, r do
  local id = ARGV[8 + i]
  local exp = redis.call('ZSCORE', KEYS[1], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[4 + i], id)
  if exp and tonumber(exp) > now_ms then
    released = released + 1
  end
end
if released > 0 then
  redis.call('PUBLISH', ARGV[7], 'released')
end

local codes = {}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if n > 0 then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms, 'LIMIT', 0, 1000)
  if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('ZREM', KEYS[3], unpack(gone))
  end
end
local in_use = redis.call('ZCARD', KEYS[1])
local free = size - in_use
local waiting = 0
if n > 0 then
  waiting = redis.call('ZCARD', KEYS[2])
end

-- The eligible waiters (acquire.lua), counted once, at most `limit`:
-- as free only shrinks within the call, "eligible >= free" stays exact.
local eligible = nil
local function count_eligible(limit)
  local members = redis.call('ZRANGE', KEYS[2], 0, -1)
  local e, room = 0, {}
  for _, m in ipairs(members) do
    local u = string.sub(m, 18)
    local left = room[u]
    if left == nil then
      left = per_user - redis.call('ZCOUNT', user_prefix .. u, '(' .. now_ms, '+inf')
    end
    if left > 0 then
      e = e + 1
      left = left - 1
    end
    room[u] = left
    if e >= limit then
      break
    end
  end
  return e
end

local used, touched, told = {}, {}, {}
local full = false
local exp = now_ms + ttl
for i = 1, n do
  local ukey = KEYS[4 + r + i]
  local code = 0
  if free <= 0 then
    code = 1
    full = true
  else
    local u = used[ukey]
    if u == nil then
      redis.call('ZREMRANGEBYSCORE', ukey, '-inf', now_ms)
      u = redis.call('ZCARD', ukey)
    end
    used[ukey] = u
    if u >= per_user then
      code = 2
      if reclaim ~= '' and not told[ukey] then
        told[ukey] = true
        redis.call('PUBLISH', reclaim, 'user:' .. string.sub(ukey, #user_prefix + 1))
      end
    elseif waiting >= free then
      if eligible == nil then
        eligible = count_eligible(free)
      end
      if eligible >= free then
        code = 3
      end
    end
    if code == 0 then
      local id = ARGV[8 + r + i]
      redis.call('ZADD', KEYS[1], exp, id)
      redis.call('ZADD', ukey, exp, id)
      used[ukey] = u + 1
      touched[ukey] = true
      free = free - 1
      in_use = in_use + 1
    end
  end
  codes[i] = code
end
if full and reclaim ~= '' then
  redis.call('PUBLISH', reclaim, 'full')
end
if next(touched) ~= nil then
  redis.call('PEXPIRE', KEYS[1], keep)
  for ukey in pairs(touched) do
    redis.call('PEXPIRE', ukey, keep)
  end
end

local reply = {in_use, size, waiting, released}
if n == 0 then
  reply[3] = redis.call('ZCARD', KEYS[2])
end
for i = 1, n do
  reply[4 + i] = codes[i]
end
return reply
