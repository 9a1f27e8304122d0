-- Sliding log step: the Redis twin of limit.SlidingLog. KEYS[1] is a sorted
-- set of entries "seq:cost" scored by their time (us) on the log's own time
-- line; KEYS[2] (same slot) holds the logged sum, the next seq, the latest
-- instant seen and the shift of the time line (log time - Redis time, grown
-- by every step back of Redis' clock). Exact: no window of length W holds
-- more than limit admitted units.
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 handle (unused), 5 packed
--       doubles: limit, window (us), ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0, Redis TIME (us)}.
local op, cost = ARGV[2], tonumber(ARGV[3])
local limit, win, ttl = struct.unpack('<ddd', ARGV[5])
local sum, seq, last, shift = 0, 0, 0, 0
local raw = redis.call('GET', KEYS[2])
if raw and #raw == 32 then
  sum, seq, last, shift = struct.unpack('<dddd', raw)
  if not (sum >= 0 and seq >= 0 and last >= 0 and shift >= 0 and last < 9007199254740992 and shift < 9007199254740992) then
    sum, seq, last, shift = 0, 0, 0, 0
  end
elseif raw and #raw == 16 then
  sum, seq = load2(KEYS[2]) -- the state before the time line was kept
end
-- now on the log's time line; more than the tolerance behind the latest
-- instant seen is a step back of Redis' clock, and the line shifts.
local now = now_us() + shift
if last - now > TOLERANCE then
  shift = shift + last - now
  now = last
end

local function costof(member)
  return tonumber(string.sub(member, string.find(member, ':', 1, true) + 1))
end

local function save()
  redis.call('SET', KEYS[2], struct.pack('<dddd', sum, seq, last, shift), 'PX', ttl)
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
  return {0, 0, 0, 0, 0, TIME_US}
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
  -- a stale now is logged at the latest instant seen, so nothing expires
  -- early, even after a refund removed the newest entry
  redis.call('ZADD', KEYS[1], str(math.max(now, last)), str(seq) .. ':' .. str(cost))
  seq = seq + 1
  sum = sum + cost
else
  -- the oldest entries, 16 at a time, until enough cost would be gone:
  -- the work is the entries that must expire, not the whole log
  status = 1
  local freed, from, found = 0, 0, false
  while not found do
    local part = redis.call('ZRANGE', KEYS[1], from, from + 15, 'WITHSCORES')
    if #part == 0 then break end
    for i = 1, #part, 2 do
      freed = freed + costof(part[i])
      if sum - freed + cost <= limit then
        retry = (tonumber(part[i + 1]) + win - now) * 1000
        found = true
        break
      end
    end
    from = from + 16
  end
end
local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 2 then reset = math.max(tonumber(newest[2]) + win - now, 0) * 1000 end
last = math.max(last, now)
save()
return {status, math.max(limit - sum, 0), retry, reset, 0, TIME_US}
