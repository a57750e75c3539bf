-- One all-or-nothing decision over limits of several kinds, run atomically
-- by Redis. Each kind follows gcra-core to the microsecond:
--
--   tag 0  a GCRA rate        Quota::check (Quota::peek for a cost of 0),
--                             exactly as gcra_all.lua
--   tag 1  a sliding window   Window::check
--   tag 2  a calendar period  Period::check
--   tag 3  a concurrency      Concurrency::acquire over the live slots
--          limit              (Lease::live), each leased (Lease::expiry)
--
-- and they are combined as gcra-core's crate docs say ("Several kinds in one
-- decision"): the verdict is Verdict::of over the decisions (a shadow limit
-- never refuses); if it allows, every limit's write is applied; if it
-- refuses, no write of a limit that passed (a pass's write is its charge;
-- such a limit replies with a peek, the key as it stands), and the write of
-- a limit that refused, a repair (a TAT capped after the clock went back, a
-- window's entries ahead of now re-stamped), is applied. A concurrency
-- limit's slots are taken here; their release and renewal by id are
-- release.lua's and renew.lua's.
--
-- KEYS[i]         the keys (distinct; one slot on a cluster)
-- ARGV[6i-5..6i]  for KEYS[i]: tag, a, b, c, cost (0: a peek), shadow (1:
--                 never refuses), the canonical decimal form of integers:
--   tag 0 rate    a = T (us), b = tau (us), c = the most debt a settlement
--                 may leave (us, 0 to 2^50), as gcra_all.lua
--   tag 1 window  a = limit (1 to 1024), b = window (us, 1 to 2^50), c = 0
--   tag 2 period  a = limit (1 to 2^32 - 1), b = unit (0 day, 1 ISO week,
--                 2 month), c = offset of local time from UTC (s, -64800
--                 to 64800)
--   tag 3 concurrency  a = limit (1 to 2^32 - 1), b = lease (us, 1 to
--                 2^50), c = the request's slot id (1 to 2^64 - 1; 0 only
--                 for a peek, which takes nothing)
-- Returns {allowed_i, remaining_i, retry_after_us_i, reset_after_us_i} for
-- each key, in order, flattened, like gcra_all.lua. A cost above a limit,
-- a time past 2^53 us or bad arguments return an error reply, never a
-- decision, and nothing is written.
--
-- What each kind keeps in its key (anything else is no value: a key of
-- another type, or a value that does not parse, reads as absent and is
-- replaced by the next write):
--   rate    a string, the TAT (us), PX until the bucket is full (gcra.lua's)
--   window  a list, the counted requests' timestamps (us) oldest first,
--           each the canonical form of an integer up to 2^53; PEXPIRE the
--           window (rounded up to the ms): by then every entry has expired
--   period  a string "start:count" (the period's first instant in us since
--           the epoch, and its count), PX until the next period starts. A
--           string, not a hash: it is read by the same MGET as the TATs and
--           written, with its expiry, by one SET .. PX; a hash would take
--           an HMGET per key and HSET then PEXPIRE
--   concurrency  a sorted set, one member "<id>:<k>" (k = 1 .. cost) per
--           unit of cost a request holds, scored by its expiry (us); a
--           slot is live while now < score <= 2^53 (a score beyond 2^53
--           is garbage). A decision counts the live ones (ZCOUNT, no
--           write); a pass that stands drops the others (expired or
--           garbage), adds its cost's members expiring at now + lease and
--           PEXPIREs the key to its latest expiry (rounded up to the ms):
--           by then every slot has expired. A refusal, a peek, or a pass
--           in a refused decision writes nothing: expired slots count for
--           nothing anyway
--
-- Written for Redis's CPU, like the other scripts: no helper functions, one
-- MGET for every key (a list answers nil there), an LRANGE per window, a
-- ZCOUNT per concurrency limit.

local MAX = 9007199254740992
local keys, argv = KEYS, ARGV
local n = #keys
local find, match, format, floor = string.find, string.match, string.format, math.floor

if n == 0 then
  return redis.error_reply("decide_mixed: at least one key is required")
end
if #argv ~= 6 * n then
  return redis.error_reply("decide_mixed: 6 arguments per key are required (tag, a, b, c, cost, shadow)")
end
for i = 2, n do
  for j = 1, i - 1 do
    if keys[i] == keys[j] then
      return redis.error_reply("decide_mixed: key " .. i .. " is key " .. j .. ": the keys must be distinct")
    end
  end
end

if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call("TIME")
local secs = time[1] + 0
-- In 2255: gcra-core refuses to decide, even a peek. (Compared before the
-- sum, which reads 2^53 + 1 as 2^53; secs * 10^6 is exact.)
if secs * 1000000 > MAX - time[2] then
  return redis.error_reply("decide_mixed: time values exceed the exact range of Lua numbers")
end
local now = secs * 1000000 + time[2]
-- One read for the strings of the rates and periods (reads change
-- nothing: every argument is checked below, before any write). MGET
-- answers a key of another type (a list) with nil, false in Lua. A
-- decision of windows and concurrency limits alone reads no string (a
-- string at their key makes LRANGE or ZCOUNT fail, which reads the same).
local values = {}
for i = 1, n do
  local tag = argv[6 * i - 5]
  if tag == "0" or tag == "2" then
    values = redis.call("MGET", unpack(keys))
    break
  end
end

-- Each limit alone. reply starts as a copy of ARGV's first 4n (a table at
-- its full size). Per key: write[i], what to write (false: nothing; a rate's
-- TAT, a period's record, the number of entries a window appends, or the
-- expiry of a concurrency limit's new slots), ttl[i] its expiry in ms,
-- peek[i] the reset_after of the key as it stands when the write is a charge
-- (false for a repair), for a window trim[i] (-1: DEL, false: keep every
-- entry, else LTRIM from there) to stop[i], and for a concurrency limit
-- trim[i] true when the key is of another type (DEL it first).
local reply, refused = { unpack(argv, 1, 4 * n) }, false
local write, ttl, peek, trim, stop = {}, {}, {}, {}, {}
for i = 1, n do
  local o, r = 6 * i - 6, 4 * i - 4
  local tag, a1, a2, a3, a4, a5 = argv[o + 1], argv[o + 2], argv[o + 3], argv[o + 4], argv[o + 5], argv[o + 6]
  if not ((a4 == "0" or find(a4, "^[1-9]%d*$")) and (a5 == "0" or a5 == "1")) then
    return redis.error_reply("decide_mixed: key " .. i .. ": the cost must be an integer from 0 and shadow 0 or 1, got "
      .. a4 .. " " .. a5)
  end
  local cost = a4 + 0
  write[i], peek[i], trim[i] = false, false, false

  if tag == "0" then
    -- A rate: gcra_all.lua's rules, line for line.
    if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and (a3 == "0" or find(a3, "^[1-9]%d*$"))) then
      return redis.error_reply("decide_mixed: key " .. i .. ": a rate's T, tau and max debt must be integers (T and"
        .. " tau from 1, max debt from 0), got " .. a1 .. " " .. a2 .. " " .. a3)
    end
    if #a3 > 16 or a3 + 0 > 1125899906842624 then
      return redis.error_reply("decide_mixed: key " .. i .. ": the max debt must be at most 2^50")
    end
    local t, tau, debt = a1 + 0, a2 + 0, a3 + 0
    if (t >= MAX and a1 ~= "9007199254740992") or (tau >= MAX and a2 ~= "9007199254740992")
        or (cost >= MAX and a4 ~= "9007199254740992") or tau < t then
      return redis.error_reply("decide_mixed: key " .. i .. ": T and tau must be integers with"
        .. " 1 <= T <= tau <= 2^53, and cost at most 2^53")
    end
    local increment = t * cost
    if increment > tau then
      return redis.error_reply("decide_mixed: key " .. i .. ": cost exceeds the burst: it can never pass")
    end
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
    if cost == 0 then
      -- A peek refuses only while the bucket is in debt.
      local left = tau - (tat - now)
      if left < 0 then
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, -left, tat - now
      else
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, tat - now
      end
    else
      if increment > MAX - tat then
        return redis.error_reply("decide_mixed: time values exceed the exact range of Lua numbers")
      end
      local ahead = tat + increment - now
      if ahead > tau then
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, ahead - tau, tat - now
        if capped then
          write[i], ttl[i] = tat, tat - now
        end
      else
        local left = tau - ahead
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, (left - left % t) / t, 0, ahead
        write[i], ttl[i], peek[i] = now + ahead, ahead, ahead - increment
      end
    end
    if write[i] then
      local px = ttl[i] + 999
      ttl[i] = (px - px % 1000) / 1000
    end

  elseif tag == "1" then
    -- A window: Window::check. limit <= 1024, window <= 2^50.
    if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and a3 == "0") or #a1 > 4 or a1 + 0 > 1024
        or #a2 > 16 or a2 + 0 > 1125899906842624 then
      return redis.error_reply("decide_mixed: key " .. i .. ": a window's limit (1 to 1024), window (1 to 2^50 us)"
        .. " and third argument (0) must be integers, got " .. a1 .. " " .. a2 .. " " .. a3)
    end
    local limit, w = a1 + 0, a2 + 0
    if cost > limit then
      return redis.error_reply("decide_mixed: key " .. i .. ": cost exceeds the limit: it can never pass")
    end
    -- The log: a list of canonical integers up to 2^53. A string there (MGET
    -- saw it), a key of another type (LRANGE fails), or an entry that does
    -- not parse: no log, replaced whole by the next write.
    local log, len, replace = nil, 0, false
    if values[i] then
      replace = true
    else
      log = redis.pcall("LRANGE", keys[i], "0", "-1")
      if log.err then
        replace = true
      else
        len = #log
      end
    end
    -- Rules 2 and 3, in one pass: entries sorted ascending (else the log
    -- is corrupt: read as empty, dropped whole), each expired (now - e >= W:
    -- e + W may pass 2^53), counted, or ahead of now. The entries become
    -- numbers in place.
    local expired, counted, ahead, sorted, previous = 0, 0, 0, true, 0
    for j = 1, len do
      local s = log[j]
      if not (s == "0" or find(s, "^[1-9]%d*$")) then
        replace = true
        break
      end
      local e = s + 0
      if e >= MAX and s ~= "9007199254740992" then
        replace = true
        break
      end
      log[j] = e
      if e < previous then
        sorted = false
      end
      previous = e
      if e > now then
        ahead = ahead + 1
      elseif now - e >= w then
        expired = expired + 1
      else
        counted = counted + 1
      end
    end
    if replace then
      len, expired, counted, ahead = 0, 0, 0, 0
    elseif not sorted then
      expired, counted, ahead = len, 0, 0
    end
    local count = counted + ahead
    -- Until the newest counted entry expires (an ahead entry counts as now).
    local reset = 0
    if ahead > 0 then
      reset = w
    elseif counted > 0 then
      reset = w - (now - log[expired + counted])
    end
    if cost == 0 then
      local left = limit - count
      if left < 0 then
        left = 0
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, left, 0, reset
    else
      if count + cost > limit then
        -- The k-th oldest counted entry must expire first (beyond the
        -- counted ones: an ahead entry, now).
        local k, kth = count + cost - limit, now
        if k <= counted then
          kth = log[expired + k]
        end
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, w - (now - kth), reset
        if ahead > 0 then
          write[i] = ahead
        end
      else
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, limit - count - cost, 0, w
        write[i], peek[i] = ahead + cost, reset
      end
      if write[i] then
        -- The LogWrite: drop the expired entries (all of a corrupt log)
        -- and the ahead ones, append the re-stamped and the new ones.
        local px = w + 999
        ttl[i] = (px - px % 1000) / 1000
        local keep = len - expired - ahead
        if replace or (keep == 0 and len > 0) then
          trim[i] = -1
        elseif expired > 0 or ahead > 0 then
          trim[i], stop[i] = expired, len - ahead - 1
        end
      end
    end

  elseif tag == "2" then
    -- A period: Period::check. limit < 2^32, offset within 18 h.
    if not (find(a1, "^[1-9]%d*$") and (a2 == "0" or a2 == "1" or a2 == "2")
        and (a3 == "0" or find(a3, "^%-?[1-9]%d*$"))) or #a1 > 10 or a1 + 0 > 4294967295
        or #a3 > 6 or a3 + 0 > 64800 or a3 + 0 < -64800 then
      return redis.error_reply("decide_mixed: key " .. i .. ": a period's limit (1 to 2^32 - 1), unit (0, 1 or 2)"
        .. " and offset (-64800 to 64800 s) must be integers, got " .. a1 .. " " .. a2 .. " " .. a3)
    end
    local limit, offset = a1 + 0, a3 + 0
    if cost > limit then
      return redis.error_reply("decide_mixed: key " .. i .. ": cost exceeds the limit: it can never pass")
    end
    -- Rule 2, in days from 0000-03-01 (719 468 days before the epoch) and
    -- whole seconds: the offset is whole seconds, so the local day of now
    -- is that of its second, and every value stays far below 2^53.
    local day = floor((secs + offset) / 86400) + 719468
    local first, length = day, 1
    if a2 == "1" then
      -- 0000-03-01 was a Wednesday: day + 2 is 0 mod 7 on Mondays.
      first, length = day - (day + 2) % 7, 7
    elseif a2 == "2" then
      -- Howard Hinnant's civil_from_days, as period.rs: eras of 400 years
      -- (146 097 days), years from March 1st.
      local era = floor(day / 146097)
      local doe = day - era * 146097
      local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
      local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
      local mp = floor((5 * doy + 2) / 153)
      local year = yoe + era * 400
      first = day - (doy - floor((153 * mp + 2) / 5))
      -- The month's length: March to January repeat 31 30 31 30 31;
      -- February (mp 11) is that of the civil year year + 1.
      if mp < 11 then
        length = floor((153 * mp + 155) / 5) - floor((153 * mp + 2) / 5)
      elseif (year + 1) % 4 == 0 and ((year + 1) % 100 ~= 0 or (year + 1) % 400 == 0) then
        length = 29
      else
        length = 28
      end
    end
    -- Local midnights to UTC instants (whole seconds, times 10^6: exact, as
    -- every multiple of 10^6 below 2^54 is); before the epoch: 0.
    local start = ((first - 719468) * 86400 - offset) * 1000000
    if start < 0 then
      start = 0
    end
    local next = ((first + length - 719468) * 86400 - offset) * 1000000
    if next > MAX then
      return redis.error_reply("decide_mixed: time values exceed the exact range of Lua numbers")
    end
    -- Rule 3: "start:count", canonical integers, the start up to 2^53 and
    -- the count below 2^32; counted if from this period on.
    local count, stored = 0, values[i]
    if stored then
      local s, c = match(stored, "^(%d+):(%d+)$")
      if s and (s == "0" or find(s, "^[1-9]")) and (c == "0" or find(c, "^[1-9]")) and #c <= 10
          and c + 0 <= 4294967295 then
        local v = s + 0
        if v >= start and (v < MAX or s == "9007199254740992") then
          count = c + 0
        end
      end
    end
    local reset = next - now
    if cost == 0 then
      local left = limit - count
      if left < 0 then
        left = 0
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, left, 0, reset
    elseif count + cost > limit then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, reset, reset
    else
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, limit - count - cost, 0, reset
      local px = reset + 999
      write[i], ttl[i], peek[i] = format("%d:%d", start, count + cost), (px - px % 1000) / 1000, reset
    end

  elseif tag == "3" then
    -- A concurrency limit: Concurrency::acquire over Lease::live. limit <
    -- 2^32, lease <= 2^50, the id a u64 (compared as a string: 20 digits
    -- are beyond a double's exact range).
    if not (find(a1, "^[1-9]%d*$") and find(a2, "^[1-9]%d*$") and (a3 == "0" or find(a3, "^[1-9]%d*$")))
        or #a1 > 10 or a1 + 0 > 4294967295 or #a2 > 16 or a2 + 0 > 1125899906842624
        or #a3 > 20 or (#a3 == 20 and a3 > "18446744073709551615") then
      return redis.error_reply("decide_mixed: key " .. i .. ": a concurrency limit's limit (1 to 2^32 - 1), lease"
        .. " (1 to 2^50 us) and slot id (0 to 2^64 - 1) must be integers, got " .. a1 .. " " .. a2 .. " " .. a3)
    end
    local limit, lease = a1 + 0, a2 + 0
    if cost > limit then
      return redis.error_reply("decide_mixed: key " .. i .. ": cost exceeds the limit: it can never pass")
    end
    if cost > 0 and a3 == "0" then
      return redis.error_reply("decide_mixed: key " .. i .. ": taking slots needs a slot id from 1")
    end
    -- The live slots. A string (MGET saw it) or a key of another type
    -- (ZCOUNT fails): no slots, replaced whole by the next write.
    local live, replace = 0, false
    if values[i] then
      replace = true
    else
      local counted = redis.pcall("ZCOUNT", keys[i], format("(%d", now), "9007199254740992")
      if type(counted) == "number" then
        live = counted
      else
        replace = true
      end
    end
    if cost == 0 then
      local left = limit - live
      if left < 0 then
        left = 0
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, left, 0, 0
    elseif live + cost > limit then
      -- gcra_core::RETRY_HINT_US: when a slot frees, nothing here knows.
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, 0, 1000000, 0
    else
      -- Lease::expiry: past 2^53 is an error, as for every time here.
      if lease > MAX - now then
        return redis.error_reply("decide_mixed: time values exceed the exact range of Lua numbers")
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, limit - live - cost, 0, 0
      -- The expiry of the new slots; trim: DEL first (another type).
      write[i], peek[i], trim[i] = now + lease, 0, replace
    end

  else
    return redis.error_reply("decide_mixed: key " .. i .. ": the tag must be 0 (rate), 1 (window), 2 (period)"
      .. " or 3 (concurrency), got " .. tag)
  end

  if reply[r + 1] == 0 and a5 == "0" then
    refused = true
  end
end

-- The writes: every one on a pass; on a refusal only the repairs, and a
-- limit that would have passed replies with the key as it stands (cost more
-- remaining, the peek's reset). PX and PEXPIRE round up.
for i = 1, n do
  local v = write[i]
  if refused and peek[i] then
    local r = 4 * i - 4
    reply[r + 2], reply[r + 4] = reply[r + 2] + argv[6 * i - 1], peek[i]
  elseif v then
    local key, tag = keys[i], argv[6 * i - 5]
    if tag == "1" then
      local from = trim[i]
      if from == -1 then
        redis.call("DEL", key)
      elseif from then
        redis.call("LTRIM", key, format("%d", from), format("%d", stop[i]))
      end
      -- v entries of now, at most 1000 per RPUSH (Lua's unpack has a limit).
      local entry, batch = format("%d", now), {}
      for j = 1, (v < 1000 and v or 1000) do
        batch[j] = entry
      end
      while v > 0 do
        local m = v < 1000 and v or 1000
        redis.call("RPUSH", key, unpack(batch, 1, m))
        v = v - m
      end
      redis.call("PEXPIRE", key, format("%d", ttl[i]))
    elseif tag == "3" then
      -- v: the new slots' expiry. The expired and garbage slots dropped,
      -- the cost's members <id>:1 .. <id>:cost added (at most 1000 per
      -- ZADD; a member of the same name, the same request's, is moved),
      -- and the key kept until its latest slot expires.
      if trim[i] then
        redis.call("DEL", key)
      else
        redis.call("ZREMRANGEBYSCORE", key, "-inf", format("%d", now))
        redis.call("ZREMRANGEBYSCORE", key, "(9007199254740992", "+inf")
      end
      local id, score, cost, k = argv[6 * i - 2], format("%d", v), argv[6 * i - 1] + 0, 1
      local batch = {}
      while k <= cost do
        local m = 0
        while m < 2000 and k <= cost do
          batch[m + 1], batch[m + 2] = score, format("%s:%d", id, k)
          m, k = m + 2, k + 1
        end
        redis.call("ZADD", key, unpack(batch, 1, m))
      end
      local latest = redis.call("ZRANGE", key, "-1", "-1", "WITHSCORES")[2] - now
      local px = latest - latest % 1 + 999
      if latest % 1 > 0 then
        px = px + 1
      end
      redis.call("PEXPIRE", key, format("%d", (px - px % 1000) / 1000))
    elseif tag == "0" then
      redis.call("SET", key, format("%d", v), "PX", format("%d", ttl[i]))
    else
      redis.call("SET", key, v, "PX", format("%d", ttl[i]))
    end
  end
end

return reply
