-- Lease allocation: the Redis twin of lease.Allocator.Step. KEYS[1] is a
-- hash: field "learn" holds the end of the learning period (us), and one
-- field "c:<client>" per holding, "has wants expiry" (whole units, us).
-- ARGV: 1 now override (us), 2 op ("take" | "release"), 3 client,
--       4 "wants has", 5 packed doubles: capacity, lease (us).
-- Reply: {live holdings (this one included; 0 for a release), grant,
-- expiry (us), the end of the learning period while learning (us, else 0),
-- the step's now (us), Redis TIME (us)}.
-- A missing hash is a lost state (a restart, a failover, or every holding
-- long expired): the step starts learning for one lease time.
local now = now_us()
local op, client = ARGV[2], ARGV[3]
local wants, has = string.match(ARGV[4], '^(%d+) (%d+)$')
wants, has = tonumber(wants) or 0, tonumber(has) or 0
local capacity, lease = struct.unpack('<dd', ARGV[5])
local key = KEYS[1]

local learn = tonumber(redis.call('HGET', key, 'learn') or '')
if not learn then
  learn = now + lease
  redis.call('HSET', key, 'learn', str(learn))
end

-- The live holdings, in client order; expired and foreign fields go.
local holdings, mine = {}, nil
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  if string.sub(f, 1, 2) == 'c:' then
    local h, w, e = string.match(v, '^(%d+) (%d+) (%d+)$')
    h, w, e = tonumber(h), tonumber(w), tonumber(e)
    if not e or e <= now then
      redis.call('HDEL', key, f)
    else
      local c = string.sub(f, 3)
      if c ~= client then table.insert(holdings, {client = c, has = h, wants = w}) end
    end
  end
end

-- The hash only collects garbage: it outlives its holdings (two lease times,
-- at least 10 minutes of Redis' own time), so that a lost state means a
-- restart or a failover, not a quiet spell.
local keep = str(math.max(math.floor(2 * lease / 1000) + 1, 600000))
if op == 'release' then
  redis.call('HDEL', key, 'c:' .. client)
  redis.call('PEXPIRE', key, keep)
  return {0, 0, 0, 0, 0, TIME_US}
end

wants = math.min(wants, capacity)
mine = {client = client, has = 0, wants = wants}
table.insert(holdings, mine)
table.sort(holdings, function(a, b) return a.client < b.client end)
local others = 0
for _, h in ipairs(holdings) do
  if h ~= mine then others = others + h.has end
end
local room = math.max(capacity - others, 0)

local grant, learning = 0, 0
if now < learn then
  learning = learn
  grant = math.min(has, room)
else
  -- max-min on whole units: equal rounds, then one unit each in client order
  local got, active, left = {}, {}, capacity
  for i, h in ipairs(holdings) do
    got[i] = 0
    if h.wants > 0 then table.insert(active, i) end
  end
  while #active > 0 and left > 0 do
    local per = math.floor(left / #active)
    if per == 0 then
      for k = 1, left do got[active[k]] = got[active[k]] + 1 end
      break
    end
    local nxt = {}
    for _, i in ipairs(active) do
      local give = math.min(per, holdings[i].wants - got[i])
      got[i] = got[i] + give
      left = left - give
      if got[i] < holdings[i].wants then table.insert(nxt, i) end
    end
    active = nxt
  end
  for i, h in ipairs(holdings) do
    if h == mine then grant = math.min(got[i], room) end
  end
end

local expiry = now + lease
redis.call('HSET', key, 'c:' .. client, str(grant) .. ' ' .. str(wants) .. ' ' .. str(expiry))
redis.call('PEXPIRE', key, keep)
return {#holdings, grant, expiry, learning, now, TIME_US}
