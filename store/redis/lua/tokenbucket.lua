-- Token bucket step: the Redis twin of limit.TokenBucket.Take/Refund/Debit.
-- The busiest script, so it stands alone (only prelude.lua is prepended):
-- every `local function` of a script body is a new closure on every call,
-- and the hot path here has none. Lua numbers are doubles; every value
-- stays below 2^53 and divisions are corrected to be exact.
-- KEYS[1]: the deficit in scaled units and the last refill time (us),
--          packed as two little-endian doubles, so a step is one GET and
--          one SET.
-- ARGV: 1 now override (us, 0 = TIME), 2 op ("take" | "refund" | "debit"), 3 cost,
--       4 handle (unused), 5 the fixed parameters packed as six
--       little-endian doubles: unit (scaled units per token = rate period in
--       ns), gain (scaled units per ns = rate tokens), capacity (burst *
--       unit), burst, fill (ns from empty to full), ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0, Redis TIME (us)}
--   status 0 allowed, 1 denied, 2 exceeded, 3 invalid.
local own = tonumber(ARGV[1]) <= 0 -- on Redis' own clock
local now = TIME_US
if not own then now = tonumber(ARGV[1]) end
local op, cost = ARGV[2], tonumber(ARGV[3])
local unit, gain, cap, burst, fill, ttl = struct.unpack('<dddddd', ARGV[5])
if op == 'refund' and (cost <= 0 or cost > burst) then return {0, 0, 0, 0, 0, TIME_US} end
if op == 'debit' then
  if cost <= 0 then return {0, 0, 0, 0, 0, TIME_US} end
  if cost > burst then cost = burst end
end

-- The state; a missing, foreign or corrupted value (wrong length, NaN,
-- outside its range) reads as a full bucket. A deficit above the capacity
-- (kept across a lowered burst) is an empty bucket.
local d, last, seen = 0, 0, nil
local raw = redis.call('GET', KEYS[1])
if raw and #raw == 16 then
  local a, b = struct.unpack('<dd', raw)
  if a >= 0 and a < 9007199254740992 and b >= 0 and b < 9007199254740992 then
    if a > cap then a = cap end
    d, last, seen = a, b, b
  end
end

-- Refill up to now; a now behind last adds nothing and keeps last, unless
-- it is more than the clock tolerance (limit.ClockTolerance, 5 s) behind:
-- a step of Redis' clock, and last moves to now with the deficit kept.
if now <= last then
  if last - now > 5000000 then last = now end
else
  local e = (now - last) * 1000
  last = now
  if d > 0 then
    d = d - e * gain
    if e >= fill or d < 0 then d = 0 end
  end
end

-- The key's TTL (it only collects garbage) is renewed once per half TTL of
-- Redis time, not on every write: an expiry costs Redis as much as the GET.
-- On Redis' own clock a write renews it (to last + 1.5 ttl) when last moves
-- into another half-TTL period than the stored one's, or the key held no
-- state; other writes keep it (KEEPTTL). Every write since the last renewal
-- kept last within that period, so after any write the key lives at least
-- ttl more, as when every write set it. On a caller's clock (ARGV[1] > 0),
-- which says nothing of Redis' expiry clock, every write sets ttl. (While a
-- fleet still runs builds that set ttl on every write, a key one of them
-- wrote last lives at least half the ttl after a write that keeps it.)
local keep, px = false, ttl
if own then
  local half = ttl - ttl % 2
  local span = half * 500 -- half the ttl in us
  half = half / 2
  keep = seen ~= nil and last - last % span == seen - seen % span
  if not keep then px = ttl + half + math.ceil((last - now) / 1000) end
end

if op == 'refund' or op == 'debit' then
  if op == 'refund' then
    d = math.max(d - cost * unit, 0)
  else
    d = math.min(d + cost * unit, cap) -- past an empty bucket, never
  end
  if keep then
    redis.call('SET', KEYS[1], struct.pack('<dd', d, last), 'KEEPTTL')
  else
    redis.call('SET', KEYS[1], struct.pack('<dd', d, last), 'PX', px)
  end
  return {0, 0, 0, 0, 0, TIME_US}
end

local status, retry, reset = 0, 0, 0
if cost <= 0 then
  status = 3
else
  local behind = 0
  if last > now then behind = (last - now) * 1000 end
  local need = cost * unit
  if cost > burst then
    status = 2
  elseif d + need <= cap then
    d = d + need
  else
    -- retry = behind + ceil((d + need - cap) / gain), exact
    status = 1
    local x = d + need - cap
    local q = math.floor(x / gain)
    while q * gain > x do q = q - 1 end
    while (q + 1) * gain <= x do q = q + 1 end
    if q * gain < x then q = q + 1 end
    retry = behind + q
  end
  if d > 0 then
    -- reset = behind + ceil(d / gain), exact
    local q = math.floor(d / gain)
    while q * gain > d do q = q - 1 end
    while (q + 1) * gain <= d do q = q + 1 end
    if q * gain < d then q = q + 1 end
    reset = behind + q
  end
  -- Last is kept even for a full bucket (it decides how a stale reading
  -- is treated); the TTL collects the key once the bucket has been full a
  -- while.
  if keep then
    redis.call('SET', KEYS[1], struct.pack('<dd', d, last), 'KEEPTTL')
  else
    redis.call('SET', KEYS[1], struct.pack('<dd', d, last), 'PX', px)
  end
end

-- remaining = floor((cap - d) / unit), exact
local x = cap - d
local rem = math.floor(x / unit)
while rem * unit > x do rem = rem - 1 end
while (rem + 1) * unit <= x do rem = rem + 1 end
return {status, rem, retry, reset, 0, TIME_US}
