-- Token bucket step: the Redis twin of limit.TokenBucket.Take/Refund.
-- KEYS[1]: the deficit in scaled units and the last refill time (us),
--          packed in one value (load2/save2) so a step is one GET, one SET.
-- ARGV: 1 now override (us, 0 = TIME), 2 op ("take" | "refund"), 3 cost,
--       4 handle (unused), 5 the fixed parameters packed as six
--       little-endian doubles: unit (scaled units per token = rate period in
--       ns), gain (scaled units per ns = rate tokens), capacity (burst *
--       unit), burst, fill (ns from empty to full), ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0}
--   status 0 allowed, 1 denied, 2 exceeded, 3 invalid.
local now = now_us()
local op, cost = ARGV[2], tonumber(ARGV[3])
local unit, gain, cap, burst, fill, ttl = struct.unpack('<dddddd', ARGV[5])
if op == 'refund' and (cost <= 0 or cost > burst) then return {0, 0, 0, 0, 0} end
local d, last = load2(KEYS[1])

-- Refill up to now; a now behind last adds nothing and keeps last.
if now > last then
  local e = (now - last) * 1000
  last = now
  if d > 0 then
    if e >= fill then d = 0 else d = math.max(d - e * gain, 0) end
  end
end

-- Last is kept even for a full bucket (it decides how a stale reading is
-- treated); the TTL collects the key once the bucket has been full a while.
local function save() save2(KEYS[1], d, last, ttl) end

if op == 'refund' then
  d = math.max(d - cost * unit, 0)
  save()
  return {0, 0, 0, 0, 0}
end

if cost <= 0 then
  return {3, idiv(cap - d, unit), 0, 0, 0}
end
local behind = math.max(last - now, 0) * 1000
local status, retry = 0, 0
if cost > burst then
  status = 2
else
  local need = cost * unit
  if d + need <= cap then
    d = d + need
  else
    status = 1
    retry = behind + cdiv(d + need - cap, gain)
  end
end
local reset = 0
if d > 0 then reset = behind + cdiv(d, gain) end
save()
return {status, idiv(cap - d, unit), retry, reset, 0}
