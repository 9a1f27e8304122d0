-- GCRA step: the Redis twin of limit.GCRA.Take/Refund/Debit.
-- Spans are kept in ticks of 1/n ns (n = rate tokens), so the emission
-- interval T = per/n ns is exactly `per` ticks. The absolute TAT is kept as
-- whole microseconds u plus r ticks (0 <= r < 1000n), below 2^53 each.
-- KEYS[1]: u and r, packed (load2/save2).
-- ARGV: 1 now override (us), 2 op, 3 cost, 4 handle (unused), 5 packed
--       doubles: n (rate tokens), per (rate period, ns), burst, ttl (ms).
-- Reply: {status, remaining, retry_after_ns, reset_after_ns, 0, Redis TIME (us)}.
local now = now_us()
local op, cost = ARGV[2], tonumber(ARGV[3])
local n, per, burst, ttl = struct.unpack('<dddd', ARGV[5])
local tpu = 1000 * n            -- ticks per microsecond
local dvt = burst * per          -- tau + T, in ticks
local u, r = load2(KEYS[1])
local ou, orr = u, r

-- tat = max(TAT, now); a TAT beyond tau + T + the clock tolerance ahead
-- means Redis' clock stepped back: the bucket is empty at now.
local stepped = false
if u < now then
  u, r = now, 0
elseif ahead_beyond(u, r, now, dvt, tpu) then
  u, r = plus_ticks(now, dvt, tpu)
  stepped = true
end
local ahead = (u - now) * tpu + r

local function remaining(x)
  if x > dvt then return 0 end
  return idiv(dvt - x, per)
end

local function save(nu, nr) save2(KEYS[1], nu, nr, ttl) end

if op == 'refund' then
  if cost > 0 and cost <= burst then
    -- t = TAT - cost*T (borrowing whole microseconds), not before now
    local nu, nr = ou, orr - cost * per
    if nr < 0 then
      local b = cdiv(-nr, tpu)
      nu, nr = ou - b, nr + b * tpu
    end
    if nu < now then nu, nr = now, 0 end
    if nu < ou or (nu == ou and nr < orr) then save(nu, nr) end
  end
  return {0, 0, 0, 0, 0, TIME_US}
end

if op == 'debit' then
  if cost > 0 then
    if cost > burst then cost = burst end
    -- t = TAT + cost*T, from the stored TAT (not from now: a debit after a
    -- take leaves what a take of the whole cost would), at most now + tau + T
    local nr = orr + cost * per
    local nu = ou + idiv(nr, tpu)
    nr = nr - idiv(nr, tpu) * tpu
    local fu, fr = plus_ticks(now, dvt, tpu)
    if nu > fu or (nu == fu and nr > fr) then nu, nr = fu, fr end
    if nu > ou or (nu == ou and nr > orr) then save(nu, nr) end
  end
  return {0, 0, 0, 0, 0, TIME_US}
end

if stepped then save(u, r) end
if cost <= 0 then return {3, remaining(ahead), 0, cdiv(ahead, n), 0, TIME_US} end
if cost > burst then return {2, remaining(ahead), 0, cdiv(ahead, n), 0, TIME_US} end
local diff = ahead + cost * per
if diff > dvt then
  return {1, remaining(ahead), cdiv(diff - dvt, n), cdiv(ahead, n), 0, TIME_US}
end
-- next = tat + cost*T
local nr = r + cost * per
local nu = u + idiv(nr, tpu)
nr = nr - idiv(nr, tpu) * tpu
save(nu, nr)
return {0, remaining(diff), 0, cdiv(diff, n), 0, TIME_US}
