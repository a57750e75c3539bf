-- A reservation of the next slot in several GCRA buckets, all or nothing,
-- run atomically by Redis. The same rules, to the microsecond, as
-- gcra-core's reserve_all.
--
-- KEYS[i]        the bucket keys (distinct; one slot on a cluster)
-- ARGV[5i-4..5i] for KEYS[i], as gcra_all.lua: emission interval T (us),
--                burst offset tau (us), cost (0: a peek), shadow (1: never
--                makes the request wait), the most debt (us, 0 to 2^50),
--                which is also the most a reservation may wait
-- ARGV[5n+1]     the most the caller waits (us, 0 to 2^53)
-- Returns, flattened: {allowed_i, remaining_i, retry_after_us_i,
-- reset_after_us_i, tat_i} for each key, in order (tat_i: the TAT written,
-- 0 for none), then {reserved, wait_us, by, most_us, now_us} (by: the
-- position, from 1, of the first enforced bucket whose wait is the
-- request's; 0 when none makes it wait). Reserved, every bucket with a
-- cost is charged as a check at now + wait would charge it (a shadow that
-- would refuse then is not), its expiry counted from now; not reserved,
-- nothing is written but a TAT capped after the clock went back. Errors
-- (bad arguments, times past 2^53, a cost above the burst where gcra-core
-- finds one) are error replies, and nothing is written.
--
-- Written for Redis's CPU, like gcra_all.lua: no helper functions, one
-- MGET for every key, the reply table built at its size.

local MAX = 9007199254740992
local keys, argv = KEYS, ARGV
local n = #keys
local find, format = string.find, string.format

if n == 0 then
  return redis.error_reply("reserve: at least one key is required")
end
if #argv ~= 5 * n + 1 then
  return redis.error_reply("reserve: 5 arguments per key (T, tau, cost, shadow, max debt) and the max wait are required")
end
local w = argv[5 * n + 1]
-- Past 2^53 a decimal string reads inexactly: only 2^53 itself is taken.
if not (w == "0" or find(w, "^[1-9]%d*$")) or #w > 16 or (w + 0 >= MAX and w ~= "9007199254740992") then
  return redis.error_reply("reserve: the max wait must be an integer from 0 to 2^53, got " .. w)
end
local most = w + 0

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local now = time[1] * 1000000 + time[2]
if now > MAX then
  return redis.error_reply("reserve: time values exceed the exact range of Lua numbers")
end
local values = redis.call("MGET", unpack(keys))

-- Each bucket where it stands now. raw[i]: the stored TAT (false when
-- absent or corrupt), tats[i]: the bucket's TAT at now, capped[i]. The
-- reply starts as a copy of ARGV (5n + 1 entries): built at its size.
local reply = { unpack(argv) }
local raw, tats, capped = {}, {}, {}
local wait, by = 0, 0
for i = 1, n do
  local a = 5 * i - 5
  local a1, a2, a3, a4, a5 = argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4], argv[a + 5]
  if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and (a3 == "0" or find(a3, "^[1-9]%d*$"))
      and (a4 == "0" or a4 == "1") and (a5 == "0" or find(a5, "^[1-9]%d*$"))) then
    return redis.error_reply("reserve: key " .. i .. ": T, tau, cost and max debt must be integers (T and tau"
      .. " from 1, cost and max debt from 0) and shadow 0 or 1, got " .. a1 .. " " .. a2 .. " " .. a3 .. " "
      .. a4 .. " " .. a5)
  end
  if #a5 > 16 or a5 + 0 > 1125899906842624 then
    return redis.error_reply("reserve: key " .. i .. ": the max debt must be at most 2^50")
  end
  local t, tau, cost, debt = a1 + 0, a2 + 0, a3 + 0, a5 + 0
  if (t >= MAX and a1 ~= "9007199254740992") or (tau >= MAX and a2 ~= "9007199254740992")
      or (cost >= MAX and a3 ~= "9007199254740992") or tau < t then
    return redis.error_reply("reserve: key " .. i .. ": T and tau must be integers with"
      .. " 1 <= T <= tau <= 2^53, and cost at most 2^53")
  end
  -- Rule 1: only a canonical integer in [0, 2^53] is a TAT.
  local stored, v = values[i], false
  if stored and find(stored, "^[1-9]%d*$") then
    local x = stored + 0
    if x < MAX or stored == "9007199254740992" then
      v = x
    end
  end
  raw[i] = v
  local tat, cap = now, false
  if v and v >= now then
    if v - now > tau + debt then
      tat, cap = now + tau + debt, true
    else
      tat = v
    end
  end
  tats[i], capped[i] = tat, cap
  -- An enforced bucket alone: the wait for its next slot (Quota::reserve);
  -- for a peek, the end of its debt (a state that refuses until then).
  if a4 == "0" then
    local increment = t * cost
    if increment > tau then
      return redis.error_reply("reserve: key " .. i .. ": cost exceeds the burst: it can never pass")
    end
    if increment > MAX - tat then
      return redis.error_reply("reserve: time values exceed the exact range of Lua numbers")
    end
    local at = tat + increment - tau - now
    if at > wait then
      wait, by = at, i
    end
    if debt < most then
      most = debt
    end
  end
end

-- The common slot. go <= 2^53: the wait came from a TAT within it.
local go = now + wait
local reserved = wait <= most
for i = 1, n do
  local r = 5 * i - 5
  local t, tau, cost, debt = argv[r + 1] + 0, argv[r + 2] + 0, argv[r + 3] + 0, argv[r + 5] + 0
  local tat = tats[i]
  reply[r + 5] = 0
  if cost == 0 or not reserved then
    -- A peek (never a write; refused while in debt), or uncharged: the
    -- bucket as it stands now, with only a capped TAT written (not by a
    -- peek).
    local left = tau - (tat - now)
    if left < 0 and cost == 0 then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, -left, tat - now
    else
      if left < 0 then
        left = 0
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, tat - now
    end
    if cost > 0 and capped[i] then
      reply[r + 5] = tat
    end
  else
    -- The check at go (Quota::check, rule 1 at go), seen from now.
    local increment = t * cost
    if increment > tau then
      return redis.error_reply("reserve: key " .. i .. ": cost exceeds the burst: it can never pass")
    end
    local v, at_go, cap = raw[i], go, false
    if v and v >= go then
      if v - go > tau + debt then
        at_go, cap = go + tau + debt, true
      else
        at_go = v
      end
    end
    if increment > MAX - at_go then
      return redis.error_reply("reserve: time values exceed the exact range of Lua numbers")
    end
    local ahead = at_go + increment - go
    if ahead > tau then
      -- Only a shadow limit refuses at go: not charged.
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, ahead - tau, at_go - now
      if cap then
        reply[r + 5] = at_go
      end
    else
      local left = tau - ahead
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, at_go + increment - now
      reply[r + 5] = at_go + increment
    end
  end
end

-- The writes, once nothing can fail. PX rounds up, from now.
for i = 1, n do
  local v = reply[5 * i]
  if v > 0 then
    local px = v - now + 999
    redis.call("SET", keys[i], format("%d", v), "PX", format("%d", (px - px % 1000) / 1000))
  end
end

reply[5 * n + 1] = reserved and 1 or 0
reply[5 * n + 2], reply[5 * n + 3], reply[5 * n + 4], reply[5 * n + 5] = wait, by, most, now
return reply
