-- Fleet concurrency: the Redis twin of limit.Concurrency. KEYS[1] is a
-- sorted set of permits "id:slots" scored by start time (us); KEYS[2]
-- (same slot) holds the slots they hold in all. Permits older than the TTL
-- belong to holders that died: each call sweeps at most 64 of them, so no
-- call's work grows with a cost, a limit or a crowd of dead permits (the
-- rest are swept by the next calls, and count as held until then).
-- KEYS[3] (same slot) is a hash: the run id of the Redis process that
-- last vouched for the permits (run) and when it did (at, us). A Redis
-- restored from a snapshot (or a replica promoted) holds permits whose
-- releases it never saw: a take that finds the limit full asks Redis its
-- run id (INFO, at most once a second a key) and, if another process
-- vouched for the permits, drops them all and starts counting afresh (the
-- requests still in flight are not counted until they end: a short
-- over-admission, bounded by them, rather than a minute of refusals until
-- the permits' TTL).
-- ARGV: 1 now override (us), 2 op ("take" | "refund" | "oldest"), 3 slots,
--       4 permit id, 5 packed doubles: limit, ttl (us).
-- Reply: {status, remaining, 0, 0, 0, Redis TIME (us)}; for "oldest",
-- {0, slots freed, ...}: it releases the oldest live permits, whole, whose
-- slots fit in slots, whichever process took them (a release the protocol
-- sends without its permit, to any replica).
local now = now_us()
local op, slots, id = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local limit, ttl = struct.unpack('<dd', ARGV[5])
local member = id .. ':' .. str(slots)
local keep = str(math.floor(2 * ttl / 1000) + 1)

local function held()
  local n = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if n < 0 or n ~= n or redis.call('EXISTS', KEYS[1]) == 0 then
    -- no permits (all released or expired), or a foreign value: nothing held
    n = 0
    redis.call('DEL', KEYS[2])
  end
  return n
end

if op == 'refund' then
  -- A release is idempotent: a permit that is not there (already released,
  -- swept, or never taken by a call that timed out) changes nothing.
  if slots > 0 and redis.call('ZREM', KEYS[1], member) == 1 then
    if redis.call('DECRBY', KEYS[2], str(slots)) <= 0 then redis.call('DEL', KEYS[2]) end
  end
  return {0, 0, 0, 0, 0, TIME_US}
end

local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', str(now - ttl), 'LIMIT', 0, 64)
if #gone > 0 then
  local freed = 0
  for _, m in ipairs(gone) do
    freed = freed + (tonumber(string.sub(m, string.find(m, ':', 1, true) + 1)) or 0)
  end
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('DECRBY', KEYS[2], str(freed))
end
if op == 'oldest' then
  local freed, out = 0, {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, 63)) do
    local k = tonumber(string.sub(m, string.find(m, ':', 1, true) + 1)) or 0
    if freed + k > slots then break end
    freed = freed + k
    table.insert(out, m)
    if freed == slots then break end
  end
  if #out > 0 then
    redis.call('ZREM', KEYS[1], unpack(out))
    if redis.call('DECRBY', KEYS[2], str(freed)) <= 0 then redis.call('DEL', KEYS[2]) end
  end
  return {0, freed, 0, 0, 0, TIME_US}
end
local n = held()
if slots <= 0 then return {3, math.max(limit - n, 0), 0, 0, 0, TIME_US} end
if slots > limit then return {2, math.max(limit - n, 0), 0, 0, 0, TIME_US} end

-- run_id: this Redis process's run id.
local function run_id() return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '' end
if n + slots > limit then
  local v = redis.call('HMGET', KEYS[3], 'run', 'at')
  local at = tonumber(v[2]) or 0
  if v[1] and (TIME_US - at >= 1000000 or TIME_US < at) then
    local run = run_id()
    if run ~= v[1] then
      redis.call('DEL', KEYS[1], KEYS[2])
      n = 0
    end
    redis.call('HSET', KEYS[3], 'run', run, 'at', str(TIME_US))
    redis.call('PEXPIRE', KEYS[3], keep)
  end
  if n + slots > limit then return {1, math.max(limit - n, 0), 0, 0, 0, TIME_US} end
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('HSET', KEYS[3], 'run', run_id(), 'at', str(TIME_US))
end
redis.call('ZADD', KEYS[1], str(now), member)
redis.call('INCRBY', KEYS[2], str(slots))
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[3], keep)
return {0, limit - n - slots, 0, 0, 0, TIME_US}
