-- Fleet concurrency: a sorted set of permit ids scored by start time (us).
-- Entries older than the TTL belong to holders that died: they are swept.
-- KEYS[1]: the sorted set.
-- ARGV: 1 now override (us), 2 op ("take" | "refund"), 3 slots,
--       4 permit id, 5 packed doubles: limit, ttl (us).
-- Reply: {status, remaining, 0, 0, 0}.
local now = now_us()
local op, slots, id = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local limit, ttl = struct.unpack('<dd', ARGV[5])
if op == 'refund' then
  for i = 1, slots do redis.call('ZREM', KEYS[1], id .. ':' .. i) end
  return {0, 0, 0, 0, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', str(now - ttl))
local held = redis.call('ZCARD', KEYS[1])
if slots <= 0 then return {3, math.max(limit - held, 0), 0, 0, 0} end
if slots > limit then return {2, math.max(limit - held, 0), 0, 0, 0} end
if held + slots > limit then return {1, math.max(limit - held, 0), 0, 0, 0} end
for i = 1, slots do redis.call('ZADD', KEYS[1], str(now), id .. ':' .. i) end
redis.call('PEXPIRE', KEYS[1], str(math.floor(2 * ttl / 1000) + 1))
return {0, limit - held - slots, 0, 0, 0}
