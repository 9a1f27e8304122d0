-- Shared helpers, prepended to every script. Lua numbers are doubles:
-- every value kept here stays below 2^53 (times in microseconds), and
-- integer division is corrected so it is exact.

-- now_us: the caller's test override (ARGV[1] > 0) or Redis TIME.
local function now_us()
  local o = tonumber(ARGV[1])
  if o > 0 then return o end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- idiv: exact floor(x / g) for 0 <= x < 2^53, g >= 1.
local function idiv(x, g)
  local q = math.floor(x / g)
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

-- str: a number as an exact integer string (redis.call would use %.14g).
local function str(x) return string.format('%.0f', x) end
