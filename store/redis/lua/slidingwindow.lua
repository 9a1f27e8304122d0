-- Sliding window counter step: the Redis twin of limit.SlidingWindow
-- (Take, Refund, Debit).
-- Times in microseconds; limit x window(us) must stay below 2^53, so every
-- product below is exact. Retry-afters are computed to the nanosecond by
-- splitting window(ns) = window(us) x 1000.
-- KEYS[1]: start (us), cur, prev packed as three doubles.
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 handle (unused), 5 packed
--       doubles: limit, window (us), ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0, Redis TIME (us)}.
local now = now_us()
local op, cost = ARGV[2], tonumber(ARGV[3])
local limit, win, ttl = struct.unpack('<ddd', ARGV[5])
local s, cur, prev = 0, 0, 0
local raw = redis.call('GET', KEYS[1])
if raw and #raw == 24 then s, cur, prev = struct.unpack('<ddd', raw) end
local function save() redis.call('SET', KEYS[1], struct.pack('<ddd', s, cur, prev), 'PX', ttl) end

local ws = math.floor(now / win) * win
if op == 'refund' then
  if cost > 0 then
    if ws == s then cur = math.max(cur - cost, 0); save()
    elseif ws == s - win then prev = math.max(prev - cost, 0); save() end
  end
  return {0, 0, 0, 0, 0, TIME_US}
end
-- roll to the window holding now (a now in an earlier window keeps it,
-- unless it is a step of Redis' clock: then the counts move to now's)
if ws <= s and s - now > TOLERANCE then s = ws end
if ws > s then
  if ws == s + win then prev = cur else prev = 0 end
  cur, s = 0, ws
end
local el = math.min(math.max(now - s, 0), win - 1)
if op == 'debit' then
  -- counted in the current window, up to the limit (past it, never)
  if cost > 0 then cur = math.max(cur, math.min(cur + math.min(cost, limit), limit)) end
  save()
  return {0, 0, 0, 0, 0, TIME_US}
end

-- floor(a * win_ns / c) exactly, for a * win(us) < 2^53.
local function muldiv_ns(a, c)
  local x = a * win
  local q = idiv(x, c)
  return q * 1000 + idiv((x - q * c) * 1000, c)
end

local status, retry = 0, 0
if cost <= 0 then
  status = 3
elseif cost > limit then
  status = 2
elseif prev * (win - el) + (cur + cost) * win <= limit * win then
  cur = cur + cost
else
  status = 1
  if cur + cost <= limit then
    retry = win * 1000 - muldiv_ns(limit - cur - cost, prev) - el * 1000
  else
    retry = (win - el) * 1000 + math.max(win * 1000 - muldiv_ns(limit - cost, cur), 0)
  end
end
local weighted = cdiv(prev * (win - el), win)
local reset = 0
if cur > 0 then reset = (s + 2 * win - now) * 1000 elseif prev > 0 then reset = (s + win - now) * 1000 end
save() -- the roll is state too, even when nothing was counted
return {status, math.max(limit - cur - weighted, 0), retry, reset, 0, TIME_US}
