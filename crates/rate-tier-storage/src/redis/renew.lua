-- Renews the slots of concurrency limits a request still holds under its
-- id (decide_mixed.lua's tag 3): each live one expires at now + lease
-- again (Lease::expiry at Redis's TIME). Run atomically by Redis.
--
-- KEYS[i]         the keys (one slot on a cluster)
-- ARGV[3i-2..3i]  for KEYS[i]: the request's slot id (1 to 2^64 - 1), the
--                 cost it took (1 to 2^32 - 1) and the lease (us, 1 to
--                 2^50), canonical decimal
-- Returns {renewed_i}: the members "<id>:1" .. "<id>:<cost>" of each key
-- still live (now < score <= 2^53) and renewed. A slot already expired is
-- not taken again (another request may have taken its place): it is
-- dropped, with the key's other expired and garbage slots. A key that
-- holds a renewed slot is kept until its latest slot expires (PEXPIRE,
-- rounded up to the ms). A key that is absent or of another type is left
-- alone (0). Bad arguments, or a time past 2^53 us, return an error reply,
-- and nothing is written.

local MAX = 9007199254740992
local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("renew: at least one key is required")
end
if #argv ~= 3 * n then
  return redis.error_reply("renew: 3 arguments per key are required (slot id, cost, lease)")
end
for i = 1, n do
  local id, cost, lease = argv[3 * i - 2], argv[3 * i - 1], argv[3 * i]
  if not (find(id, "^[1-9]%d*$") and find(cost, "^[1-9]%d*$") and find(lease, "^[1-9]%d*$")) or #id > 20
      or (#id == 20 and id > "18446744073709551615") or #cost > 10 or cost + 0 > 4294967295
      or #lease > 16 or lease + 0 > 1125899906842624 then
    return redis.error_reply("renew: key " .. i .. ": the slot id (1 to 2^64 - 1), the cost (1 to 2^32 - 1) and"
      .. " the lease (1 to 2^50 us) must be integers, got " .. id .. " " .. cost .. " " .. lease)
  end
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local secs = time[1] + 0
if secs * 1000000 > MAX - time[2] then
  return redis.error_reply("renew: time values exceed the exact range of Lua numbers")
end
local now = secs * 1000000 + time[2]
for i = 1, n do
  if argv[3 * i] + 0 > MAX - now then
    return redis.error_reply("renew: time values exceed the exact range of Lua numbers")
  end
end
local at = format("%d", now)

local reply = {}
for i = 1, n do
  local key, id, cost = keys[i], argv[3 * i - 2], argv[3 * i - 1] + 0
  local renewed = 0
  -- Another type: ZREMRANGEBYSCORE fails, and nothing is ours to renew.
  if type(redis.pcall("ZREMRANGEBYSCORE", key, "-inf", at)) == "number" then
    redis.call("ZREMRANGEBYSCORE", key, "(9007199254740992", "+inf")
    local score = format("%d", now + argv[3 * i])
    for k = 1, cost do
      local member = format("%s:%d", id, k)
      if redis.call("ZSCORE", key, member) then
        redis.call("ZADD", key, "XX", score, member)
        renewed = renewed + 1
      end
    end
    if renewed > 0 then
      local latest = redis.call("ZRANGE", key, "-1", "-1", "WITHSCORES")[2] - now
      local px = latest - latest % 1 + 999
      if latest % 1 > 0 then
        px = px + 1
      end
      redis.call("PEXPIRE", key, format("%d", (px - px % 1000) / 1000))
    end
  end
  reply[i] = renewed
end
return reply
