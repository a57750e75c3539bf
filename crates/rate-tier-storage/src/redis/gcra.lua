-- GCRA check for one bucket, run atomically by Redis (EVALSHA).
-- The same rules, to the microsecond, as gcra-core's Quota::check.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  emission interval T, in microseconds
-- ARGV[2]  burst offset tau (T * burst), in microseconds
-- ARGV[3]  cost
-- Returns {allowed (1|0), remaining, retry_after_us, reset_after_us}; bad
-- arguments return an error reply, never a decision.
--
-- The key holds the TAT (theoretical arrival time, in microseconds on
-- Redis's clock) as an integer string, and expires when the bucket is full.

-- Lua numbers are doubles: integers are exact only up to 2^53 (gcra-core's
-- MAX_TIME_US). Every value here is kept within it.
local MAX_EXACT = 9007199254740992

local function fail(msg)
  return redis.error_reply("gcra: " .. msg)
end

-- Integer strings for SET: how Redis formats a Lua number varies by version
-- and can use an exponent.
local function int(x)
  return string.format("%.0f", x)
end

-- Only the canonical decimal form of an integer in [1, 2^53]: "1e3", " 7" or
-- "9007199254740993" (which would round to 2^53) are refused, not guessed.
local function positive_integer(value)
  if type(value) ~= "string" then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n ~= math.floor(n) or n < 1 or n > MAX_EXACT or int(n) ~= value then
    return nil
  end
  return n
end

if type(KEYS[1]) ~= "string" then
  return fail("KEYS[1] (the bucket key) is required")
end
local emission_interval = positive_integer(ARGV[1])
if emission_interval == nil then
  return fail("ARGV[1] (emission interval, us) must be an integer from 1 to 2^53")
end
local burst_offset = positive_integer(ARGV[2])
if burst_offset == nil then
  return fail("ARGV[2] (burst offset, us) must be an integer from 1 to 2^53")
end
if burst_offset < emission_interval then
  return fail("ARGV[2] (burst offset) must be at least ARGV[1] (a burst of at least 1)")
end
local cost = positive_integer(ARGV[3])
if cost == nil then
  return fail("ARGV[3] (cost) must be an integer from 1 to 2^53")
end
-- A cost above the burst can never pass, whatever the wait: refused before
-- the key is read or written (HTTP 403, not 429).
if emission_interval * cost > burst_offset then
  return fail("cost exceeds the burst: it can never pass")
end

-- Redis < 5 refuses writes after TIME unless effects are replicated; later
-- versions always do this (and 7 made the call a no-op).
if redis.replicate_commands then
  redis.replicate_commands()
end

-- Redis's clock, not the caller's: the instances' clocks do not matter.
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- A key of another type makes GET fail; pcall turns that into an error
-- table, which tonumber() reads as nil. Not an integer (this includes NaN)
-- means a corrupted value too: start fresh.
local stored = redis.pcall("GET", KEYS[1])
if type(stored) == "table" then
  stored = nil
end
local tat = tonumber(stored)
-- Only what this script writes is a TAT: "2e15" or "9007199254740993" (read
-- as 2^53) are not, as in gcra-core, which reads a u64.
if tat ~= nil and int(tat) ~= stored then
  tat = nil
end
local capped = false
if tat == nil or tat ~= math.floor(tat) or tat < now or tat > MAX_EXACT then
  tat = now
elseif tat > now + 2 * burst_offset then
  -- Beyond a burst of debt (what a settlement may leave) the clock went
  -- backwards: cap there and store that, or the user stays locked out for
  -- as long as the clock jumped back.
  tat = now + 2 * burst_offset
  capped = true
end

local increment = emission_interval * cost
if increment > MAX_EXACT - tat then
  return fail("time values exceed the exact range of Lua numbers")
end
local new_tat = tat + increment
local allow_at = new_tat - burst_offset

-- PX rounds up: a key that expired a millisecond early would give requests away.
if allow_at > now then
  if capped then
    redis.call("SET", KEYS[1], int(tat), "PX", int(math.ceil((tat - now) / 1000)))
  end
  return { 0, 0, allow_at - now, tat - now }
end

if new_tat > now then
  redis.call("SET", KEYS[1], int(new_tat), "PX", int(math.ceil((new_tat - now) / 1000)))
end

local remaining = math.floor((burst_offset - (new_tat - now)) / emission_interval)
return { 1, remaining, 0, new_tat - now }
