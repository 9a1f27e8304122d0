-- Sliding log step: the Redis twin of limit.SlidingLog. KEYS[1] is a sorted
-- set of entries "seq:cost" scored by their time (us); KEYS[2] (same slot)
-- holds the logged sum and the next seq. Exact: no window of length W holds
-- more than limit admitted units.
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 handle (unused), 5 packed
--       doubles: limit, window (us), ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0}.
local now = now_us()
local op, cost = ARGV[2], tonumber(ARGV[3])
local limit, win, ttl = struct.unpack('<ddd', ARGV[5])
local sum, seq = load2(KEYS[2])

local function costof(member)
  return tonumber(string.sub(member, string.find(member, ':', 1, true) + 1))
end

local function save()
  save2(KEYS[2], sum, seq, ttl)
  redis.call('PEXPIRE', KEYS[1], ttl)
end

if op == 'refund' then
  if cost > 0 then
    local newer = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', str(now), 'WITHSCORES')
    for i = 1, #newer, 2 do
      if tonumber(newer[i + 1]) == now and costof(newer[i]) == cost then
        redis.call('ZREM', KEYS[1], newer[i])
        sum = sum - cost
        break
      end
    end
  end
  if cost > 0 then save() end
  return {0, 0, 0, 0, 0}
end

-- expire entries at or before now - window
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', str(now - win))
if #old > 0 then
  for _, m in ipairs(old) do sum = sum - costof(m) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', str(now - win))
end

local status, retry = 0, 0
if cost <= 0 then
  status = 3
elseif cost > limit then
  status = 2
elseif sum + cost <= limit then
  local at = now
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest == 2 and tonumber(newest[2]) > at then at = tonumber(newest[2]) end
  redis.call('ZADD', KEYS[1], str(at), str(seq) .. ':' .. str(cost))
  seq = seq + 1
  sum = sum + cost
else
  status = 1
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  local freed = 0
  for i = 1, #all, 2 do
    freed = freed + costof(all[i])
    if sum - freed + cost <= limit then
      retry = (tonumber(all[i + 1]) + win - now) * 1000
      break
    end
  end
end
local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 2 then reset = math.max(tonumber(newest[2]) + win - now, 0) * 1000 end
save()
return {status, limit - sum, retry, reset, 0}
