-- Lease allocation: the Redis twin of lease.Allocator.Step. KEYS[1] is a
-- hash: field "learn" holds the end of the learning period (us), and one
-- field "c:<client>" per holding, "has wants expiry spare inuse" (whole
-- units, us; a holding without "inuse", of the previous format, has none).
-- ARGV: 1 now override (us), 2 op ("take" | "release"), 3 client,
--       4 "wants has inuse", 5 packed doubles: capacity, lease (us),
--       refresh interval (us).
-- Reply: {live holdings (this one included; 0 for a release), grant,
-- the rest of the learning period while learning (us, else 0), the safe
-- share, 0, Redis TIME (us)}; the grant expires one lease time after the
-- step's now.
-- A missing hash is a lost state (a restart, a failover, or every holding
-- long expired): the step starts learning for one lease time.
local now = now_us()
local op, client = ARGV[2], ARGV[3]
local wants, has, inuse = string.match(ARGV[4], '^(%d+) (%d+) (%d+)$')
wants, has, inuse = tonumber(wants) or 0, tonumber(has) or 0, tonumber(inuse) or 0
local capacity, lease, refresh = struct.unpack('<ddd', ARGV[5])
local key = KEYS[1]

local learn = tonumber(redis.call('HGET', key, 'learn') or '')
if not learn then
  learn = now + lease
  redis.call('HSET', key, 'learn', str(learn))
end

-- The live holdings, in client order; expired and foreign fields go.
local holdings, mine, found = {}, nil, false
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  if string.sub(f, 1, 2) == 'c:' then
    local h, w, e, s, u = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    if not h then -- the format before "inuse" (a process not yet upgraded): nothing in use
      h, w, e, s = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
      if h then u = '0' end
    end
    h, w, e, s, u = tonumber(h), tonumber(w), tonumber(e), tonumber(s), tonumber(u)
    if not u or e <= now then
      redis.call('HDEL', key, f)
    else
      local c = string.sub(f, 3)
      if c ~= client then
        table.insert(holdings, {client = c, has = h, wants = w, spare = s, inuse = u})
      else
        found = true
      end
    end
  end
end

-- A client that spends a lease (by its own clock) the hash no longer holds
-- (a holding outlives its holder's lease): Redis' clock stepped forward
-- past holdings still spent, or part of the state was lost. Learn again.
if op ~= 'release' and has > 0 and not found and now >= learn then
  learn = now + lease
  redis.call('HSET', key, 'learn', str(learn))
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
mine = {client = client, has = 0, wants = wants, spare = 0, inuse = math.min(inuse, capacity)}
table.insert(holdings, mine)
-- in byte order, as the Go step sorts: Lua's < compares with strcoll, in
-- the collation of the locale Redis was started in
local function before(x, y)
  for i = 1, math.min(#x, #y) do
    local p, q = string.byte(x, i), string.byte(y, i)
    if p ~= q then return p < q end
  end
  return #x < #y
end
table.sort(holdings, function(a, b) return before(a.client, b.client) end)
-- what the others keep (their grants, or what they reported in use when
-- more), and what their safe shares add to that
local held, spared = 0, 0
for _, h in ipairs(holdings) do
  if h ~= mine then
    local t = math.max(h.has, h.inuse)
    held, spared = held + t, spared + math.max(h.spare - t, 0)
  end
end

-- max-min on whole units between hs' wants: equal rounds, then one unit
-- each in client order from a rotating start (lease.FairShares); returns
-- who's share.
local turn = math.floor(now / math.max(lease, 1))
local function fair_share(cap, hs, who)
  local got, active, left = {}, {}, cap
  for i, h in ipairs(hs) do
    got[i] = 0
    if h.wants > 0 then table.insert(active, i) end
  end
  while #active > 0 and left > 0 do
    local per = math.floor(left / #active)
    if per == 0 then
      local n = #active
      local off = ((turn % n) * (left % n)) % n
      for k = 0, left - 1 do
        local i = active[(off + k) % n + 1]
        got[i] = got[i] + 1
      end
      break
    end
    local nxt = {}
    for _, i in ipairs(active) do
      local give = math.min(per, hs[i].wants - got[i])
      got[i] = got[i] + give
      left = left - give
      if got[i] < hs[i].wants then table.insert(nxt, i) end
    end
    active = nxt
  end
  for i, h in ipairs(hs) do
    if h == who then return got[i] end
  end
  return 0
end

-- mine's safe share while learning, beyond its confirmed holding: its
-- max-min share, by what each client wants beyond its confirmed holding,
-- of what the confirmed grants leave, within what neither the holdings nor
-- the other safe shares take (capacity less taken)
local function spare_share(taken)
  local beyond, me, confirmed = {}, nil, 0
  for _, h in ipairs(holdings) do
    local b = {client = h.client, wants = math.max(h.wants - h.has, 0)}
    if h == mine then me = b end
    table.insert(beyond, b)
    confirmed = confirmed + h.has
  end
  return math.min(fair_share(math.max(capacity - confirmed, 0), beyond, me), math.max(capacity - taken, 0))
end

local safe, learning = math.floor(capacity / #holdings), 0
if now >= learn then
  mine.has = math.min(fair_share(capacity, holdings, mine), math.max(capacity - held - spared, 0))
else
  learning = learn - now
  if has > 0 then -- a holder from before the loss: confirmed, and a safe share beyond
    mine.has = math.min(has, math.max(capacity - held, 0))
    mine.spare = mine.has
    if now >= learn - lease + refresh then -- every holder has reported
      mine.spare = mine.has + spare_share(held + mine.has + spared)
    end
  else
    mine.spare = spare_share(held + spared)
  end
  safe = mine.spare
end

local expiry = now + lease
redis.call('HSET', key, 'c:' .. client, str(mine.has) .. ' ' .. str(wants) .. ' ' .. str(expiry) .. ' ' .. str(mine.spare) .. ' ' .. str(mine.inuse))
redis.call('PEXPIRE', key, keep)
return {#holdings, mine.has, learning, safe, 0, TIME_US}
