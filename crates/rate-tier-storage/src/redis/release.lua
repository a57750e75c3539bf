-- Gives back the slots of concurrency limits a request took under its id
-- (decide_mixed.lua's tag 3): Concurrency::release, by id. Run atomically
-- by Redis.
--
-- KEYS[i]         the keys (one slot on a cluster)
-- ARGV[2i-1..2i]  for KEYS[i]: the request's slot id (1 to 2^64 - 1) and
--                 the cost it took (1 to 2^32 - 1), canonical decimal
-- Returns {released_i}: the members "<id>:1" .. "<id>:<cost>" removed from
-- each key (fewer than the cost when some were never taken, or expired and
-- were dropped by a later decision: a release frees nothing that is not
-- held). The key's slots that have expired (score <= now, Redis's TIME) are
-- dropped too. A key that is absent or of another type is left alone (0).
-- Bad arguments return an error reply, and nothing is written.

local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("release: at least one key is required")
end
if #argv ~= 2 * n then
  return redis.error_reply("release: 2 arguments per key are required (slot id, cost)")
end
for i = 1, n do
  local id, cost = argv[2 * i - 1], argv[2 * i]
  if not (find(id, "^[1-9]%d*$") and find(cost, "^[1-9]%d*$")) or #id > 20
      or (#id == 20 and id > "18446744073709551615") or #cost > 10 or cost + 0 > 4294967295 then
    return redis.error_reply("release: key " .. i .. ": the slot id (1 to 2^64 - 1) and the cost (1 to 2^32 - 1)"
      .. " must be integers, got " .. id .. " " .. cost)
  end
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = format("%d", time[1] * 1000000 + time[2])

local reply = {}
for i = 1, n do
  local key, id, cost = keys[i], argv[2 * i - 1], argv[2 * i] + 0
  local released = 0
  -- Another type: ZREMRANGEBYSCORE fails, and nothing is ours to remove.
  if type(redis.pcall("ZREMRANGEBYSCORE", key, "-inf", now)) == "number" then
    local k, batch = 1, {}
    while k <= cost do
      local m = 0
      while m < 1000 and k <= cost do
        m = m + 1
        batch[m] = format("%s:%d", id, k)
        k = k + 1
      end
      released = released + redis.call("ZREM", key, unpack(batch, 1, m))
    end
  end
  reply[i] = released
end
return reply
