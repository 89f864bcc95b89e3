-- recent_read.lua: sum the last `buckets` buckets of the recent HASH (the
-- current one included) per counter, and drop the fields of older ones;
-- sum the last `latest` buckets too, under the counter's name prefixed
-- "r:".
--
-- KEYS[1]  recent HASH: field "<bucket start ms>:<counter>" → count
-- ARGV[1]  bucket width in ms
-- ARGV[2]  how many buckets make the window
-- ARGV[3]  how many of the latest buckets make the "r:" sums
--
-- Returns a flat list: counter name, sum, counter name, sum, …
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local width = tonumber(ARGV[1])
local from = now_ms - now_ms % width - (tonumber(ARGV[2]) - 1) * width
local latest = now_ms - now_ms % width - (tonumber(ARGV[3]) - 1) * width
local all = redis.call('HGETALL', KEYS[1])
local sums, names, stale = {}, {}, {}
for i = 1, #all, 2 do
  local field = all[i]
  local sep = string.find(field, ':', 1, true)
  local bucket = sep and tonumber(string.sub(field, 1, sep - 1))
  if bucket == nil or bucket < from then
    stale[#stale + 1] = field
  else
    local name = string.sub(field, sep + 1)
    local n = tonumber(all[i + 1])
    if sums[name] == nil then
      sums[name] = 0
      names[#names + 1] = name
    end
    sums[name] = sums[name] + n
    if bucket >= latest then
      local r = 'r:' .. name
      if sums[r] == nil then
        sums[r] = 0
        names[#names + 1] = r
      end
      sums[r] = sums[r] + n
    end
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
local out = {}
for _, name in ipairs(names) do
  out[#out + 1] = name
  out[#out + 1] = sums[name]
end
return out
