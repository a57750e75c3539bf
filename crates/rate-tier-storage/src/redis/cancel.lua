-- Reservations given back, each bucket on its own, run atomically by Redis.
-- The same rules as gcra-core's Quota::cancel.
--
-- KEYS[i]        the bucket keys (one slot on a cluster)
-- ARGV[3i-2..3i] for KEYS[i]: emission interval T (us), the cost reserved,
--                and the TAT the reservation wrote (us, 1 to 2^53)
-- Returns one integer per key: 0 kept (the stored TAT is no longer the
-- reservation's: a later one was made, or time passed it), 1 moved back by
-- T * cost, 2 cleared (the bucket is full again). Moving a TAT back past a
-- later reservation would hand its slot out twice: only the last one goes
-- back. Bad arguments return an error reply, and nothing is written.

local MAX = 9007199254740992
local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("cancel: at least one key is required")
end
if #argv ~= 3 * n then
  return redis.error_reply("cancel: 3 arguments per key are required (T, cost, reserved TAT)")
end
for i = 1, n do
  local a = 3 * i - 3
  local a1, a2, a3 = argv[a + 1], argv[a + 2], argv[a + 3]
  -- T and the TAT from 1 to 2^53, the cost a u32 (as a BucketCheck's).
  if not (find(a1, "^[1-9]%d*$") and (a2 == "0" or find(a2, "^[1-9]%d*$")) and find(a3, "^[1-9]%d*$"))
      or #a1 > 16 or (a1 + 0 >= MAX and a1 ~= "9007199254740992")
      or #a3 > 16 or (a3 + 0 >= MAX and a3 ~= "9007199254740992")
      or #a2 > 10 or a2 + 0 > 4294967295 then
    return redis.error_reply("cancel: key " .. i .. ": T and the TAT must be integers from 1 to 2^53 and the"
      .. " cost from 0 to 2^32 - 1, got " .. a1 .. " " .. a2 .. " " .. a3)
  end
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = time[1] * 1000000 + time[2]
local values = redis.call("MGET", unpack(keys))

local reply = {}
for i = 1, n do
  local a = 3 * i - 3
  local tat = argv[a + 3] + 0
  reply[i] = 0
  -- Still the reservation's TAT (the same canonical string), still ahead.
  if values[i] == argv[a + 3] and tat > now then
    -- Below 2^53 the product is exact; past it, it is past the TAT too.
    local back = (argv[a + 1] + 0) * (argv[a + 2] + 0)
    if back < tat and tat - back > now then
      local floor = tat - back
      local px = floor - now + 999
      redis.call("SET", keys[i], format("%d", floor), "PX", format("%d", (px - px % 1000) / 1000))
      reply[i] = 1
    else
      redis.call("DEL", keys[i])
      reply[i] = 2
    end
  end
end
return reply
