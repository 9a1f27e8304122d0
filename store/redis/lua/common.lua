-- Shared helpers, prepended to every script. Lua numbers are doubles:
-- every value kept here stays below 2^53 (times in microseconds), and
-- integer division is corrected so it is exact.

-- TOLERANCE: limit.ClockTolerance in microseconds. A now further behind a
-- state's latest instant is a step of Redis' clock, not a stale reading.
local TOLERANCE = 5000000

-- now_us: the caller's test override (ARGV[1] > 0) or Redis TIME.
local function now_us()
  local o = tonumber(ARGV[1])
  if o > 0 then return o end
  return TIME_US
end

-- idiv: exact floor(x / g) for |x| < 2^53, g >= 1. Outside that range
-- (only reachable from a foreign or corrupted state value) it returns the
-- rounded quotient without correcting it: the correction loops must never
-- spin on doubles that cannot step by one.
local function idiv(x, g)
  local q = math.floor(x / g)
  if q >= 9007199254740992 or q <= -9007199254740992 then return q end
  while q * g > x do q = q - 1 end
  while (q + 1) * g <= x do q = q + 1 end
  return q
end

-- cdiv: exact ceil(x / g).
local function cdiv(x, g)
  local q = idiv(x, g)
  if q * g < x then q = q + 1 end
  return q
end

-- load2 / save2: a state of two numbers packed as two little-endian
-- doubles (exact for integers below 2^53, and much cheaper than decimal
-- strings). A missing, foreign or corrupted value (wrong length, NaN,
-- negative, 2^53 or more) reads as the fresh state 0, 0.
local function load2(key)
  local raw = redis.call('GET', key)
  if raw and #raw == 16 then
    local a, b = struct.unpack('<dd', raw)
    -- NaN fails both tests; anything outside [0, 2^53) is not ours.
    if a >= 0 and a < 9007199254740992 and b >= 0 and b < 9007199254740992 then return a, b end
  end
  return 0, 0
end

local function save2(key, a, b, ttl_ms)
  redis.call('SET', key, struct.pack('<dd', a, b), 'PX', ttl_ms)
end

-- ahead_beyond: whether a virtual instant u us + r ticks (0 <= r < tpu) is
-- more than d ticks + TOLERANCE ahead of now, exactly, without products
-- that could pass 2^53.
local function ahead_beyond(u, r, now, d, tpu)
  local q = idiv(d, tpu)
  local x = u - now - q - TOLERANCE
  if x ~= 0 then return x > 0 end
  return r > d - q * tpu
end

-- plus_ticks: now + d ticks as u us + r ticks.
local function plus_ticks(now, d, tpu)
  local q = idiv(d, tpu)
  return now + q, d - q * tpu
end

-- str: an integer as an exact decimal string, for commands that need one.
local function str(x) return string.format('%.0f', x) end
