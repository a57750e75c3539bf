-- GCRA check for one bucket, run atomically by Redis (EVALSHA).
-- The same rules, to the microsecond, as gcra-core's Quota::check.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  emission interval T, in microseconds
-- ARGV[2]  burst offset tau (T * burst), in microseconds
-- ARGV[3]  cost
-- ARGV[4]  optional: the most debt a settlement or reservation may leave, in
--          microseconds (0 to 2^50; absent: gcra-core's default, an hour or
--          tau if longer)
-- Returns {allowed (1|0), remaining, retry_after_us, reset_after_us}; bad
-- arguments return an error reply, never a decision, and write nothing.
--
-- The key holds the TAT (theoretical arrival time, in microseconds on
-- Redis's clock) as an integer string, and expires when the bucket is full.
--
-- This runs on every request, and Redis's CPU is the limiter's ceiling: no
-- helper function (Redis would build its closure on every call), one
-- pattern match for the three arguments, and "%d" (a third of the cost of
-- "%.0f") for the two numbers written.

-- Lua numbers are doubles: integers are exact only up to 2^53 (gcra-core's
-- MAX_TIME_US). Every value here is kept within it.
local MAX = 9007199254740992
local argv = ARGV
local key, a1, a2, a3 = KEYS[1], argv[1], argv[2], argv[3]
local format = string.format

if key == nil then
  return redis.error_reply("gcra: KEYS[1] (the bucket key) is required")
end
-- Only the canonical decimal form of integers: "1e3", " 7", "07", "0x10" or
-- "1.0" are refused, not guessed.
local n = #argv
if (n ~= 3 and n ~= 4) or not string.find(a1 .. " " .. a2 .. " " .. a3, "^[1-9]%d* [1-9]%d* [1-9]%d*$") then
  return redis.error_reply("gcra: ARGV must be T, tau and cost (us, us, units): 3 integers from 1 to 2^53")
end
local t, tau, cost = a1 + 0, a2 + 0, a3 + 0
local debt = 3600000000
if tau > debt then
  debt = tau
end
if n == 4 then
  local a4 = argv[4]
  -- 2^50 (gcra-core's MAX_WINDOW_US) at most: 16 digits, exact.
  if not (a4 == "0" or string.find(a4, "^[1-9]%d*$")) or #a4 > 16 or a4 + 0 > 1125899906842624 then
    return redis.error_reply("gcra: ARGV[4] (the max debt) must be an integer from 0 to 2^50")
  end
  debt = a4 + 0
end
-- Past 2^53 a decimal string reads inexactly ("9007199254740993" reads as
-- 2^53): only 2^53 itself is exact.
if (t >= MAX and a1 ~= "9007199254740992") or (tau >= MAX and a2 ~= "9007199254740992")
    or (cost >= MAX and a3 ~= "9007199254740992") then
  return redis.error_reply("gcra: ARGV must be T, tau and cost (us, us, units): 3 integers from 1 to 2^53")
end
if tau < t then
  return redis.error_reply("gcra: ARGV[2] (burst offset) must be at least ARGV[1] (a burst of at least 1)")
end
-- A cost above the burst can never pass, whatever the wait: refused before
-- the key is read or written (HTTP 403, not 429).
local increment = t * cost
if increment > tau then
  return redis.error_reply("gcra: cost exceeds the burst: it can never pass")
end

-- Redis < 5 refuses writes after TIME unless effects are replicated; later
-- versions always do this (and 7 made the call a no-op).
if redis.replicate_commands then
  redis.replicate_commands()
end

-- Redis's clock, not the caller's: the instances' clocks do not matter.
local time = redis.call("TIME")
local now = time[1] * 1000000 + time[2]

-- A key of another type makes GET fail: pcall returns an error table (a
-- string's .err is nil, string.err). A missing key is false. Only what this
-- script writes is a TAT, as in gcra-core, which reads a u64: the canonical
-- decimal form of an integer, at most 2^53 ("9007199254740993" reads as
-- 2^53, "1.5", "2e15" or " 7" are not TATs), and not behind now.
local stored, tat, capped = redis.pcall("GET", key), now, false
if stored and not stored.err and string.find(stored, "^[1-9]%d*$") then
  local v = stored + 0
  if v >= now and (v < MAX or stored == "9007199254740992") then
    if v - now > tau + debt then
      -- Beyond the most debt a settlement may leave the clock went
      -- backwards: cap there and store that, or the user stays locked out
      -- for as long as the clock jumped back.
      tat, capped = now + tau + debt, true
    else
      tat = v
    end
  end
end

if increment > MAX - tat then
  return redis.error_reply("gcra: time values exceed the exact range of Lua numbers")
end
local ahead = tat + increment - now

-- PX rounds up (a key that expired a millisecond early would give requests
-- away); x - x % 1000 is exact below 2^53, math.ceil a function call.
if ahead > tau then
  if capped then
    local px = tat - now + 999
    redis.call("SET", key, format("%d", tat), "PX", format("%d", (px - px % 1000) / 1000))
  end
  return { 0, 0, ahead - tau, tat - now }
end

local px = ahead + 999
redis.call("SET", key, format("%d", now + ahead), "PX", format("%d", (px - px % 1000) / 1000))
local left = tau - ahead
return { 1, (left - left % t) / t, 0, ahead }
