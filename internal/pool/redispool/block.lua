-- block.lua: the pool's one acquire script (docs/OPERATIONS.md, "Slot
-- blocks"). Every slot of the pool is granted here, so each limit rule is
-- written once. One call carries, in this order: leases given back; a
-- process's waiters to try (the dispatcher's pass, wait.go); direct
-- requests (TryAcquire, a waiter's first try). Time comes from Redis TIME
-- so every process agrees on lease expiry.
--
-- KEYS[1]        leases ZSET: member lease id, score expiry (ms)
-- KEYS[2]        waiters ZSET: member waiter id, score enqueue time (µs)
-- KEYS[3]        waiter expiry ZSET: member waiter id, score expiry (ms)
-- KEYS[4]        the adaptive limit's HASH (adapt.lua), read when ARGV[5]
--                is "1"
-- KEYS[5..]      the user ZSET of each lease given back (r of them), then
--                of each waiter (w), then of each direct request (n), in
--                the order of their ARGV below
-- ARGV[1]        global size (CONNECTION_POOL_SIZE)
-- ARGV[2]        per-user limit (CONNECTION_POOL_PER_USER)
-- ARGV[3]        lease TTL in ms; a waiter registered here lives as long
--                unless refreshed (renew.lua; a try does not refresh it)
-- ARGV[4]        user key prefix: a user's ZSET is ARGV[4]..user. The sets
--                of other waiting users are read by that name without
--                being declared: they share the {pool} hash tag, so they
--                are in the declared keys' cluster slot.
-- ARGV[5]        "1" when adaptive concurrency is on: the global size is
--                then lowered to the `limit` field of KEYS[4] (adapt.lua
--                keeps it), when that exists and is lower. Else "0" and
--                KEYS[4] is not read.
-- ARGV[6]        reclaim channel (ReclaimChannel): asks every process to
--                give back the idle leases it keeps (idle.go). Published
--                to when a new waiter stays in line ("waiting"), when a
--                direct request finds no free slot ("full") or its user at
--                the limit ("user:"..user). "" publishes nothing.
-- ARGV[7]        notification channel, told when a live lease was given
--                back
-- ARGV[8]        r, the number of leases given back
-- ARGV[9]        w, the number of waiters
-- ARGV[10..9+r]  the lease ids given back
-- then 4 per waiter:
--                the lease id to add when granted;
--                its member: 16 id characters, ":", then the user;
--                its place in line (µs since the epoch): when its work
--                was queued, 0 meaning now (Redis TIME); used when it
--                registers;
--                "1" when it defers (AcquireOrDefer): at its user's limit
--                it is withdrawn (code 2) instead of left waiting, else "0"
-- then one new lease id per direct request (n: the rest)
--
-- The rules. free = size - live leases. A registered waiter's turn key is
-- its user's live leases plus the number of that user's waiters older
-- than it: round-robin between users (the user holding fewest slots
-- first), FIFO within one. A waiter is eligible while its key is below the
-- per-user limit.
--   - A waiter is granted when its user has a free per-user slot and fewer
--     than `free` eligible waiters come before it (lower key, or the same
--     key and older). Else code 1, or 2 when its user is at the limit
--     (told while a slot is free, and always to a waiter that defers:
--     the others stay in line either way), and it stays registered
--     (registered now if it was not), unless it defers and got 2.
--   - A direct request is granted when a slot is free (else code 1), its
--     user is below the limit (else 2), and the eligible waiters are
--     fewer than the free slots (else 3: they belong to waiters).
-- The waiters not in line are registered first; then the requests are
-- judged one after the other, each on the state the previous ones left,
-- as separate calls in that order would be.
--
-- Returns {in_use, size, waiters, released, then per waiter code and
-- enqueued, then per direct request code}: in_use counts live leases
-- afterwards, size is the global size applied (lowered by the adaptive
-- limit), waiters the registered waiters afterwards, released how many
-- live leases were given back; code 0 granted, 1 pool exhausted (or, for
-- a waiter, the free slots belong to waiters before it), 2 user limit,
-- 3 the free slots belong to waiters; enqueued is the waiter's place in
-- line (its score).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
local w = tonumber(ARGV[9])
local wargs = 9 + r         -- ARGV index just before the first waiter's
local dargs = wargs + 4 * w -- just before the first direct request's
local n = #ARGV - dargs
local wkeys = 4 + r         -- KEYS index just before the first waiter's
local dkeys = wkeys + w
local keep = 3 * ttl
local exp = now_ms + ttl

local function notify(what)
  if reclaim ~= '' then
    redis.call('PUBLISH', reclaim, what)
  end
end

local released = 0
for i = 1, r do
  local id = ARGV[9 + i]
  local e = redis.call('ZSCORE', KEYS[1], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[4 + i], id)
  if e and tonumber(e) > now_ms then
    released = released + 1
  end
end
if released > 0 then
  redis.call('PUBLISH', ARGV[7], 'released')
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if n + w > 0 then
  -- Waiters of a process that stopped refreshing them (it died).
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms, 'LIMIT', 0, 1000)
  if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('ZREM', KEYS[3], unpack(gone))
  end
end
local in_use = redis.call('ZCARD', KEYS[1])
local free = size - in_use

-- Each user's live leases, by user key, counted once a call and kept as
-- it grants.
local live = {}
local after_now = '(' .. now_ms
local function live_of(ukey)
  local c = live[ukey]
  if c == nil then
    c = redis.call('ZCOUNT', ukey, after_now, '+inf')
    live[ukey] = c
  end
  return c
end

-- The line: the registered waiters in Redis order, read at most once a
-- call (again after waiters register), then kept here: each one's user,
-- score and turn key, and how many are eligible. A waiter leaving the
-- line is marked gone rather than removed, and only the keys that move
-- are updated, so a call that grants many slots reads the line once.
local members = nil   -- position → member
local scores, pos     -- member → score, position
local users, keys     -- position → user key, turn key (nil until needed)
local by_user, gone   -- user key → its positions, oldest first; position → true
local eligible, in_line = 0, 0
local function read_line()
  if members ~= nil then
    return
  end
  local flat = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  members, scores, pos, users, keys, by_user, gone = {}, {}, {}, {}, nil, {}, {}
  in_line = #flat / 2
  for i = 1, in_line do
    local m = flat[2 * i - 1]
    local u = user_prefix .. string.sub(m, 18)
    local mine = by_user[u]
    if mine == nil then
      mine = {}
      by_user[u] = mine
    end
    mine[#mine + 1] = i
    members[i], scores[m], pos[m], users[i] = m, flat[2 * i], i, u
  end
end
-- The turn keys, computed when first needed (a call that finds no slot
-- free never counts the waiting users' leases).
local function read_keys()
  read_line()
  if keys ~= nil then
    return
  end
  keys, eligible = {}, 0
  local seen = {}
  for i, u in ipairs(users) do
    if not gone[i] then
      local s = seen[u] or 0
      local k = live_of(u) + s
      keys[i] = k
      seen[u] = s + 1
      if k < per_user then
        eligible = eligible + 1
      end
    else
      keys[i] = per_user -- never counted
    end
  end
end
-- bump moves by d the turn keys of u's waiters at positions lo to hi.
local function bump(u, lo, hi, d)
  if keys == nil then
    return -- computed from the live counts when needed
  end
  for _, j in ipairs(by_user[u] or {}) do
    if j >= lo and j <= hi and not gone[j] then
      local k = keys[j]
      if k < per_user then
        eligible = eligible - 1
      end
      k = k + d
      keys[j] = k
      if k < per_user then
        eligible = eligible + 1
      end
    end
  end
end
-- leave_line takes member m out of the line: granted (its user's live
-- count grows by one, so its user's older waiters move back one) or
-- withdrawn (its user's younger waiters move up one).
local function leave_line(m, granted)
  read_line()
  local i = pos[m]
  if i == nil or gone[i] then
    return
  end
  gone[i] = true
  in_line = in_line - 1
  if keys ~= nil and keys[i] < per_user then
    eligible = eligible - 1
  end
  if granted then
    bump(users[i], 1, i - 1, 1)
  else
    bump(users[i], i + 1, #members, -1)
  end
end
local waiting = nil -- the line's length before it is read
local function line_len()
  if members ~= nil then
    return in_line
  end
  if waiting == nil then
    waiting = redis.call('ZCARD', KEYS[2])
  end
  return waiting
end

-- Whether fewer than `free` eligible waiters come before member m.
local function my_turn(m)
  read_keys()
  local mp = pos[m]
  if mp == nil or gone[mp] then
    return false
  end
  local mk = keys[mp]
  local ahead = 0
  for i, k in ipairs(keys) do
    if i > mp and mk == 0 then
      break -- no key is below 0: nobody behind comes first
    end
    if i ~= mp and not gone[i] and k < per_user and (k < mk or (k == mk and i < mp)) then
      ahead = ahead + 1
      if ahead >= free then
        return false
      end
    end
  end
  return true
end

local touched = {}
local function grant(ukey, id)
  if not touched[ukey] then
    touched[ukey] = true
    redis.call('ZREMRANGEBYSCORE', ukey, '-inf', now_ms)
  end
  redis.call('ZADD', KEYS[1], exp, id)
  redis.call('ZADD', ukey, exp, id)
  live[ukey] = live_of(ukey) + 1
  free = free - 1
  in_use = in_use + 1
end

local reply = {0, 0, 0, released}

-- Waiters: those not in line registered first, then all judged in order.
-- The expiry of those in line is left to renewal (renew.lua).
if w > 0 then
  local fresh, registered = {}, false
  if line_len() > 0 then
    read_line()
  else
    scores = {}
  end
  for j = 1, w do
    local m = ARGV[wargs + 4 * j - 2]
    local score = scores[m]
    if score then
      score = tonumber(score)
    else
      fresh[j] = true
      score = tonumber(ARGV[wargs + 4 * j - 1])
      if score == nil or score <= 0 then
        score = now_us
      end
      redis.call('ZADD', KEYS[2], score, m)
      redis.call('ZADD', KEYS[3], exp, m)
      registered = true
    end
    reply[3 + 2 * j + 1] = score
  end
  if registered then
    redis.call('PEXPIRE', KEYS[2], keep)
    redis.call('PEXPIRE', KEYS[3], keep)
    members, waiting = nil, nil -- read again with the new ones
  end
  local stays = false
  for j = 1, w do
    local id = ARGV[wargs + 4 * j - 3]
    local m = ARGV[wargs + 4 * j - 2]
    local deferring = ARGV[wargs + 4 * j] == '1'
    local ukey = KEYS[wkeys + j]
    local code = 1
    -- With no free slot only a deferring waiter needs to know whether its
    -- user is at the limit: the others stay in line either way.
    if free <= 0 and not deferring then
      code = 1
    elseif live_of(ukey) >= per_user then
      code = 2
      if deferring then
        redis.call('ZREM', KEYS[2], m)
        redis.call('ZREM', KEYS[3], m)
        leave_line(m, false)
      end
    elseif free > 0 and my_turn(m) then
      code = 0
      redis.call('ZREM', KEYS[2], m)
      redis.call('ZREM', KEYS[3], m)
      leave_line(m, true)
      grant(ukey, id)
    end
    if code ~= 0 and fresh[j] then
      stays = true
    end
    reply[3 + 2 * j] = code
  end
  -- A new waiter that stays in line tells every process to give back its
  -- idle leases.
  if stays then
    notify('waiting')
  end
end

-- Direct requests.
local told, full = {}, false
for i = 1, n do
  local ukey = KEYS[dkeys + i]
  local code = 0
  if free <= 0 then
    code = 1
    full = true
  elseif live_of(ukey) >= per_user then
    code = 2
    if not told[ukey] then
      told[ukey] = true
      notify('user:' .. string.sub(ukey, #user_prefix + 1))
    end
  elseif line_len() >= free then
    read_keys()
    if eligible >= free then
      code = 3
    end
  end
  if code == 0 then
    grant(ukey, ARGV[dargs + i])
    if members ~= nil then
      bump(ukey, 1, #members, 1) -- its waiters' turn keys grow with its live count
    end
  end
  reply[4 + 2 * w + i] = code
end
if full then
  notify('full')
end

if next(touched) ~= nil then
  redis.call('PEXPIRE', KEYS[1], keep)
  for ukey in pairs(touched) do
    redis.call('PEXPIRE', ukey, keep)
  end
end
reply[1] = in_use
reply[2] = size
reply[3] = line_len()
return reply
