-- Fixed window step: the Redis twin of limit.FixedWindow.Take/Refund/Debit.
-- KEYS[1]: hash {s = window start (us), c = used}.
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 handle (unused), 5 packed
--       doubles: limit, window (us).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0, Redis TIME (us)}.
local now = now_us()
local op, cost = ARGV[2], tonumber(ARGV[3])
local limit, win = struct.unpack('<dd', ARGV[5])
local st = redis.call('HMGET', KEYS[1], 's', 'c')
local s, c = tonumber(st[1]) or 0, tonumber(st[2]) or 0
local ws = math.floor(now / win) * win
if op == 'refund' then
  if cost > 0 and ws == s then
    c = math.max(c - cost, 0)
    redis.call('HSET', KEYS[1], 'c', str(c))
  end
  return {0, 0, 0, 0, 0, TIME_US}
end
-- Forward only: a left window never reopens; but a now more than the
-- clock tolerance before the window is a step of Redis' clock, and the
-- count moves to now's window.
local s0 = s
if ws > s then s, c = ws, 0 elseif s - now > TOLERANCE then s = ws end
if op == 'debit' then
  -- counted in the window of now, up to the limit (past it, never)
  if cost > 0 then
    local n = math.max(c, math.min(c + math.min(cost, limit), limit))
    if n ~= c or s ~= s0 then
      redis.call('HSET', KEYS[1], 's', str(s), 'c', str(n))
      redis.call('PEXPIRE', KEYS[1], str(math.floor((math.max(s - now, 0) + win + TOLERANCE) / 1000) + 1))
    end
  end
  return {0, 0, 0, 0, 0, TIME_US}
end
local status, retry = 0, 0
if cost <= 0 then
  status = 3
elseif cost > limit then
  status = 2
elseif c + cost <= limit then
  c = c + cost
else
  status = 1
  retry = (s + win - now) * 1000
end
local reset = 0
if c > 0 then reset = (s + win - now) * 1000 end
-- Only a take changes the count, and only a new window (or a step of the
-- clock) changes s. Within its window an admitted take adds its cost (one
-- command) and leaves the TTL set when the window began: a window plus
-- the clock tolerance from then (from s, if that step was early), which
-- outlasts the window for any later step, even one up to the tolerance
-- behind the first (such a step still counts in this window). A step that
-- changes neither writes nothing: the next one reads the same state and
-- decides the same from it.
if status == 0 and s == s0 and st[1] and st[2] and string.match(st[2], '^%d+$') then
  redis.call('HINCRBY', KEYS[1], 'c', cost)
elseif status == 0 or s ~= s0 then
  redis.call('HSET', KEYS[1], 's', str(s), 'c', str(c))
  redis.call('PEXPIRE', KEYS[1], str(math.floor((math.max(s - now, 0) + win + TOLERANCE) / 1000) + 1))
end
return {status, math.max(limit - c, 0), retry, reset, 0, TIME_US}
