-- Several GCRA buckets decided as one, all or nothing, run atomically by
-- Redis. The same rules, to the microsecond, as gcra-core's check_all.
--
-- KEYS[i]        the bucket keys (distinct; one slot on a cluster)
-- ARGV[5i-4..5i] for KEYS[i]: emission interval T (us), burst offset tau
--                (us), cost (0: a peek, which refuses only while the bucket
--                is in debt), shadow (1: never refuses), the most
--                debt a settlement may leave (us, 0 to 2^50)
-- Returns {allowed_i, remaining_i, retry_after_us_i, reset_after_us_i} for
-- each key, in order, flattened. The decision is refused when an enforced
-- bucket refuses; then no bucket is charged, and a bucket that would have
-- passed says so (allowed 1) with its state uncharged. Bad arguments return
-- an error reply, never a decision, and nothing is written.
--
-- Written for Redis's CPU, like gcra.lua: no helper functions, one MGET
-- for every key, the reply table built at its size.

local MAX = 9007199254740992
local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("gcra_all: at least one key is required")
end
if #argv ~= 5 * n then
  return redis.error_reply("gcra_all: 5 arguments per key are required (T, tau, cost, shadow, max debt)")
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = time[1] * 1000000 + time[2]
-- In 2255: gcra-core refuses to decide, even a peek.
if now > MAX then
  return redis.error_reply("gcra_all: time values exceed the exact range of Lua numbers")
end
-- One read for every key (reads change nothing: the arguments are checked
-- below, before any write). MGET answers a key of another type with nil,
-- false in Lua: no value, as in gcra.lua.
local values = redis.call("MGET", unpack(keys))

-- Each bucket alone. The reply starts as a copy of ARGV's first 4n: a
-- table built at its full size (one filled one entry at a time reallocates
-- five times for 12). values[i] becomes the TAT to write (a charge, or a cap), or false.
local reply, refused = { unpack(argv, 1, 4 * n) }, false
for i = 1, n do
  local a, r = 5 * i - 5, 4 * i - 4
  local a1, a2, a3, a4, a5 = argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4], argv[a + 5]
  -- Canonical decimal integers (a cost of exactly "0", else no leading
  -- zero), shadow 0 or 1. One match per argument: a concatenation would
  -- cost more than it saves.
  if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and (a3 == "0" or find(a3, "^[1-9]%d*$"))
      and (a4 == "0" or a4 == "1") and (a5 == "0" or find(a5, "^[1-9]%d*$"))) then
    return redis.error_reply("gcra_all: key " .. i .. ": T, tau, cost and max debt must be integers (T and tau"
      .. " from 1, cost and max debt from 0) and shadow 0 or 1, got " .. a1 .. " " .. a2 .. " " .. a3 .. " "
      .. a4 .. " " .. a5)
  end
  -- 2^50 (gcra-core's MAX_WINDOW_US) at most: 16 digits, exact.
  if #a5 > 16 or a5 + 0 > 1125899906842624 then
    return redis.error_reply("gcra_all: key " .. i .. ": the max debt must be at most 2^50")
  end
  local debt = a5 + 0
  -- Past 2^53 a decimal string reads inexactly ("9007199254740993" reads as
  -- 2^53): only 2^53 itself is taken.
  local t, tau, cost = a1 + 0, a2 + 0, a3 + 0
  if (t >= MAX and a1 ~= "9007199254740992") or (tau >= MAX and a2 ~= "9007199254740992")
      or (cost >= MAX and a3 ~= "9007199254740992") or tau < t then
    return redis.error_reply("gcra_all: key " .. i .. ": T and tau must be integers with"
      .. " 1 <= T <= tau <= 2^53, and cost at most 2^53")
  end
  local increment = t * cost
  if increment > tau then
    return redis.error_reply("gcra_all: key " .. i .. ": cost exceeds the burst: it can never pass")
  end

  -- Rule 1, as in gcra.lua: only a canonical integer in [now, 2^53] is a
  -- TAT; the clock went back when it is more than tau + max debt ahead.
  local stored, tat, capped = values[i], now, false
  if stored and find(stored, "^[1-9]%d*$") then
    local v = stored + 0
    if v >= now and (v < MAX or stored == "9007199254740992") then
      if v - now > tau + debt then
        tat, capped = now + tau + debt, true
      else
        tat = v
      end
    end
  end
  values[i] = false
  if cost == 0 then
    -- A peek: never writes, not even a cap; with a debt (a TAT more than
    -- tau ahead) nothing remains, and it refuses until the debt is paid.
    local left = tau - (tat - now)
    if left < 0 then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, -left, tat - now
      if a4 == "0" then
        refused = true
      end
    else
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, tat - now
    end
  else
    if increment > MAX - tat then
      return redis.error_reply("gcra_all: time values exceed the exact range of Lua numbers")
    end
    local ahead = tat + increment - now
    if ahead > tau then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, ahead - tau, tat - now
      if a4 == "0" then
        refused = true
      end
      if capped then
        values[i] = tat
      end
    else
      local left = tau - ahead
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, ahead
      values[i] = now + ahead
    end
  end
end

-- Refused: a bucket that would have passed is not charged, and says how it
-- stands: cost more remaining, T * cost less ahead. (A capped TAT refuses
-- any cost, so such a bucket has nothing else to write.)
if refused then
  for i = 1, n do
    local a, r = 5 * i - 5, 4 * i - 4
    if reply[r + 1] == 1 and values[i] then
      local cost = argv[a + 3] + 0
      reply[r + 2], reply[r + 4] = reply[r + 2] + cost, reply[r + 4] - argv[a + 1] * cost
      values[i] = false
    end
  end
end

-- The writes: every charge, or only the caps. PX rounds up (a key that
-- expired a millisecond early would give requests away); x - x % 1000 is
-- exact below 2^53.
for i = 1, n do
  local v = values[i]
  if v then
    local px = v - now + 999
    redis.call("SET", keys[i], format("%d", v), "PX", format("%d", (px - px % 1000) / 1000))
  end
end

return reply
