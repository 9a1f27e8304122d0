-- Leaky bucket (paced queue) step: the Redis twin of limit.LeakyBucket.TakeBy.
-- Spans are ticks of 1/n ns as in gcra.lua; Next is u microseconds + r ticks.
-- KEYS[1]: u and r, packed (load2/save2).
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 budget (ns until the request's
--       deadline, 0 = none), 5 packed doubles: n (rate tokens), per (rate
--       period, ns), queue, ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, wait_ns, Redis TIME (us)}
--   status 0 allowed, 1 denied, 2 exceeded, 3 invalid, 4 too late.
local now = now_us()
local op, cost, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n, per, queue, ttl = struct.unpack('<dddd', ARGV[5])
if op == 'refund' then return {0, 0, 0, 0, 0, TIME_US} end -- a scheduled slot stays spent
local tpu = 1000 * n
local dvt = (queue + 1) * per
local u, r = load2(KEYS[1])
if u < now then
  u, r = now, 0
elseif ahead_beyond(u, r, now, dvt, tpu) then
  -- Redis' clock stepped back: the queue is full at now.
  u, r = plus_ticks(now, dvt, tpu)
  save2(KEYS[1], u, r, ttl)
end
local ahead0 = (u - now) * tpu + r

local function room(x)
  if x > dvt then return 0 end
  return idiv(dvt - x, per)
end

if cost <= 0 then return {3, room(ahead0), 0, cdiv(ahead0, n), 0, TIME_US} end
if cost > queue + 1 then return {2, room(ahead0), 0, cdiv(ahead0, n), 0, TIME_US} end
local ahead = ahead0 + cost * per
if ahead > dvt then
  return {1, room(ahead0), cdiv(ahead - dvt, n), cdiv(ahead0, n), 0, TIME_US}
end
local wait = cdiv(ahead0, n)
if budget > 0 and wait >= budget then
  return {4, room(ahead0), 0, cdiv(ahead0, n), 0, TIME_US}
end
local nr = r + cost * per
local nu = u + idiv(nr, tpu)
nr = nr - idiv(nr, tpu) * tpu
save2(KEYS[1], nu, nr, ttl)
return {0, room(ahead), 0, cdiv(ahead, n), wait, TIME_US}
