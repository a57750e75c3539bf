-- Settles GCRA buckets after their requests were served, run atomically by
-- Redis: the same rules as gcra-core's Quota::settle.
--
-- KEYS[i]        the bucket keys
-- ARGV[4i-3..4i] for KEYS[i]: emission interval T (us), burst offset tau
--                (us), units: a positive integer charges a debt (at most
--                up to now + tau + max debt), a negative one refunds (never
--                below now), 0 changes nothing; the most debt a settlement
--                may leave (us, 0 to 2^50)
-- Returns {remaining_i, reset_after_us_i} for each key, flattened. Bad
-- arguments return an error reply and nothing is written.
--
-- Written for Redis's CPU, like gcra.lua: no helper functions, one MGET
-- for every key.

local MAX = 9007199254740992
local UNITS = 4294967295
local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("gcra_settle: at least one key is required")
end
if #argv ~= 4 * n then
  return redis.error_reply("gcra_settle: 4 arguments per key are required (T, tau, units, max debt)")
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = time[1] * 1000000 + time[2]
-- One read for every key (reads change nothing: the arguments are checked
-- below, before any write). MGET answers a key of another type with nil,
-- false in Lua: no value, as in gcra.lua.
local values = redis.call("MGET", unpack(keys))

-- Decide every bucket first: an error writes nothing. values[i] becomes the
-- TAT to store, now to delete the key (the bucket is full), or false to
-- leave it. The reply is built at its size (from ARGV's first 2n entries).
local reply = { unpack(argv, 1, 2 * n) }
for i = 1, n do
  local a = 4 * i - 4
  local a1, a2, a3, a4 = argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4]
  -- Canonical decimal integers: units exactly "0", or signed with no
  -- leading zero.
  if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and (a3 == "0" or find(a3, "^%-?[1-9]%d*$"))
      and (a4 == "0" or find(a4, "^[1-9]%d*$"))) then
    return redis.error_reply("gcra_settle: key " .. i .. ": T, tau, units and max debt must be integers (T and"
      .. " tau from 1, max debt from 0), got " .. a1 .. " " .. a2 .. " " .. a3 .. " " .. a4)
  end
  -- 2^50 (gcra-core's MAX_WINDOW_US) at most: 16 digits, exact.
  if #a4 > 16 or a4 + 0 > 1125899906842624 then
    return redis.error_reply("gcra_settle: key " .. i .. ": the max debt must be at most 2^50")
  end
  local ceiling = a2 + a4
  local t, tau, units = a1 + 0, a2 + 0, a3 + 0
  if (t >= MAX and a1 ~= "9007199254740992") or (tau >= MAX and a2 ~= "9007199254740992") or tau < t then
    return redis.error_reply("gcra_settle: key " .. i .. ": T and tau must be integers with 1 <= T <= tau <= 2^53")
  end
  if units > UNITS or units < -UNITS then
    return redis.error_reply("gcra_settle: key " .. i .. ": units must be an integer from -(2^32 - 1) to 2^32 - 1")
  end
  -- Rule 1, as in gcra.lua.
  local stored, tat, capped = values[i], now, false
  if stored and find(stored, "^[1-9]%d*$") then
    local v = stored + 0
    if v >= now and (v < MAX or stored == "9007199254740992") then
      if v - now > ceiling then
        tat, capped = now + ceiling, true
      else
        tat = v
      end
    end
  end
  local v
  if units >= 0 then
    -- A debt, up to the ceiling now + tau + max debt: compared as
    -- distances, each exact (T * units may not be, but is then far above
    -- the ceiling).
    local debt = t * units
    if debt > ceiling - (tat - now) then
      v = now + ceiling
    else
      v = tat + debt
    end
  else
    -- A refund, never below now (T * units, if inexact, is far below).
    v = tat + t * units
    if v < now then
      v = now
    end
  end
  if v > MAX then
    return redis.error_reply("gcra_settle: time values exceed the exact range of Lua numbers")
  end
  values[i] = (v ~= tat or capped) and v
  local left = tau - (v - now)
  if left < 0 then
    left = 0
  end
  reply[2 * i - 1], reply[2 * i] = (left - left % t) / t, v - now
end

for i = 1, n do
  local v = values[i]
  if v == now then
    redis.call("DEL", keys[i])
  elseif v then
    local px = v - now + 999
    redis.call("SET", keys[i], format("%d", v), "PX", format("%d", (px - px % 1000) / 1000))
  end
end
return reply
