package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// Batching: concurrent decisions of one limiter that map to one Redis node
// and slot go to Redis as one script call that runs every step in order.
// Each step stays atomic and exactly as it would be alone (the script is
// the same body, called once per step inside one atomic EVALSHA), but the
// per-command costs of Redis — dispatch, the script call, the TIME read —
// are paid once per batch instead of once per decision.
//
// Group commit without a timer: a decision goes out at once while fewer
// than maxInflight batches of its group are in flight, or while its group
// has at most soloMax decisions under way (few callers: each goes out alone,
// as without batching); otherwise it waits for the next batch, which the
// first waiting decision sends as soon as a batch in flight returns. Alone,
// a decision never waits for a batch; under load, batches grow with the
// load. No decision waits beyond Options.Timeout and Options.ReplyGrace
// from its arrival: a batch's deadline is its oldest decision's.

const (
	// maxInflight is the batches of one group in flight at once: enough to
	// keep a pipelined connection busy, few enough that waiting decisions
	// gather into batches.
	maxInflight = 2
	// soloMax is the most decisions under way in a group (in flight or
	// waiting, this one included) at which a decision still goes out at
	// once, whatever is in flight. A few callers gain nothing from sharing
	// script calls, since Redis is not yet their bottleneck, and waiting for
	// a batch in flight cost them: measured (bench/sweep_test.go), 4 callers
	// took 15.5 µs per decision batching from two batches in flight, 13.0
	// with soloMax 4 and 12.8 without batching; 16 and 64 callers keep
	// batching (6.7 and 3.9 µs, against 8.6 and 7.5 without).
	soloMax = 4
)

// batchSource wraps an algorithm script (which reads KEYS[1] and ARGV[1..5]
// and returns five integers and Redis' time) into one that runs it for every
// key of KEYS, after the helpers it needs. ARGV of the batch: 1 now
// override (µs, 0: Redis TIME, read once for the whole batch), 2 the
// expiry (the Redis time after which the batch's oldest caller gives up, as
// in prelude.lua; 0: none), 3 the fixed parameters, then op, cost, extra
// per key. The reply is the five integers of each step, in order, then
// Redis' time; a step that raised an error (WRONGTYPE under a foreign key)
// answers status -1 without failing the others. A batch that Redis reaches
// after its expiry does nothing and answers {-2, time}.
func batchSource(helpers, body string) string {
	return batchHeader + helpers + `
local function step(KEYS, ARGV)
` + body + `
end
local own = tonumber(ARGV[1])
local now = own
if now <= 0 then now = TIME_US end
ARGV[1] = now -- for helpers of common.lua that read the global ARGV
-- one KEYS and one ARGV table for every step (no body writes to them); a
-- body's own ARGV[1] is the override as sent (0: Redis TIME), so that the
-- token bucket knows whose clock it runs on
local K, A, out, k = {}, {own, '', '', '', ARGV[3]}, {}, 0
for i = 1, #KEYS do
  local j = 3 * i + 1
  K[1], A[2], A[3], A[4] = KEYS[i], ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local ok, r = pcall(step, K, A)
  if not ok then r = {-1, 0, 0, 0, 0} end -- an error reply for this step alone
  out[k + 1], out[k + 2], out[k + 3], out[k + 4], out[k + 5] = r[1], r[2], r[3], r[4], r[5]
  k = k + 5
end
out[k + 1] = TIME_US
return out
`
}

// batchHeader reads Redis' time once for the batch and answers {-2, time}
// to a batch reached after its expiry (ARGV[2]).
const batchHeader = `local TIME_US
do
  local t = redis.call('TIME')
  TIME_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
do
  local expiry = tonumber(ARGV[2])
  if expiry > 0 and TIME_US > expiry then return {-2, TIME_US} end
end
`

// counterBatchSource is the batched form of a Counter: fixedwindow.lua's
// take and refund at a limit no count reaches, written out rather than
// wrapped, because a count is one or two commands and the per-step costs
// of the wrapper (a call, its reply table, three arguments, five replies)
// would be most of the batch (measured under sluice serve's load: 5.1 µs of
// Redis CPU per step wrapped, 2.4 written out). ARGV: 1 now override (µs,
// 0: Redis TIME), 2 the expiry (as batchSource's), 3 the fixed parameters
// (limit, window in µs, packed doubles), then one signed cost per key: a
// take of cost ≥ 0, or a refund of −cost (a take past the limit is refused,
// as fixedwindow.lua refuses it). The reply is {status, remaining}
// per key (status as fixedwindow.lua's; −1: the step failed, a foreign
// value under the key), then Redis' time.
func counterBatchSource(helpers string) string {
	return batchHeader + helpers + `local now = tonumber(ARGV[1])
if now <= 0 then now = TIME_US end
local limit, win = struct.unpack('<dd', ARGV[3])
local ws = math.floor(now / win) * win
local out, k = {}, 0
for i = 1, #KEYS do
  local key, cost = KEYS[i], tonumber(ARGV[i + 3])
  local status, c = -1, 0
  local ok, st = pcall(redis.call, 'HMGET', key, 's', 'c')
  if ok then
    local s = tonumber(st[1]) or 0
    c = tonumber(st[2]) or 0
    if cost < 0 then
      -- a refund: only in the window still counting
      if ws == s and c > 0 then
        c = math.max(c + cost, 0)
        redis.call('HSET', key, 'c', str(c))
      end
      status = 0
    else
      local s0 = s
      if ws > s then s, c = ws, 0 elseif s - now > TOLERANCE then s = ws end
      status = 3
      if cost > limit then
        status = 2
      elseif cost > 0 and c + cost <= limit then
        status, c = 0, c + cost
      elseif cost > 0 then
        status = 1
      end
      if status == 0 and s == s0 and st[1] and st[2] and string.match(st[2], '^%d+$') then
        redis.call('HINCRBY', key, 'c', cost)
      elseif status == 0 or s ~= s0 then
        redis.call('HSET', key, 's', str(s), 'c', str(c))
        redis.call('PEXPIRE', key, str(math.floor((math.max(s - now, 0) + win + TOLERANCE) / 1000) + 1))
      end
    end
  end
  out[k + 1], out[k + 2] = status, math.max(limit - c, 0)
  k = k + 2
end
out[k + 1] = TIME_US
return out
`
}

// call is one decision waiting in a batch.
type call struct {
	key, op, extra string
	cost           int64
	budget         int64 // paced steps: ns to the caller's deadline at arrival (0: none)
	arrived        clock.Instant
	queued         bool // waited in pending for a batch
	res            [5]int64
	err            error
	batch          []*call       // set when this call is made the leader of a batch
	one            [1]*call      // the batch of this call alone, without an allocation
	done           chan struct{} // result ready, or leadership handed over
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// group is the batching state of the keys of one limiter that share a
// slot (all keys, on a standalone server).
type group struct {
	mu       sync.Mutex
	pending  []*call
	inflight int
	active   int // decisions under way: in flight or pending
}

// batcher batches the steps of one limiter.
type batcher struct {
	l      *limiter
	script *rueidis.Lua

	mu     sync.Mutex
	groups map[uint16]*group // by slot; slot 0 on a standalone server
	single group
}

// newBatcher returns a batcher for l, or nil when the store does not batch.
func newBatcher(l *limiter, script *rueidis.Lua) *batcher {
	if l.s.opts.Batch <= 1 {
		return nil
	}
	return &batcher{l: l, script: script, groups: map[uint16]*group{}}
}

// group returns the batching group of key, and the breaker of its node.
func (b *batcher) group(key string) (*group, *breaker) {
	if cn := b.l.s.conn.Load(); cn == nil || !cn.cluster {
		return &b.single, b.l.s.breakerFor(key)
	}
	slot := keySlot(key)
	b.mu.Lock()
	g := b.groups[slot]
	if g == nil {
		g = &group{}
		b.groups[slot] = g
	}
	b.mu.Unlock()
	return g, b.l.s.breakerForSlot(slot)
}

// do runs one step (op on key) in a batch and returns the script's five
// integers. budget, for a paced step, is the time in ns from now to the
// caller's deadline; the time spent waiting for the batch is taken off it.
// A caller whose ctx ends while it still waits for a batch leaves without
// its step having run.
func (b *batcher) do(ctx context.Context, key, op string, cost int64, extra string, budget int64) ([5]int64, error) {
	s := b.l.s
	if err := ctx.Err(); err != nil {
		return [5]int64{}, fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	g, br := b.group(key)
	if br.held() {
		s.maybeProbe(br)
		return [5]int64{}, br.unavailable()
	}
	c := callPool.Get().(*call)
	c.key, c.op, c.cost, c.extra, c.budget, c.arrived = key, op, cost, extra, budget, clock.Now()
	g.mu.Lock()
	g.active++
	if g.inflight < maxInflight || g.active <= soloMax {
		g.inflight++
		batch := g.take(c, s.opts.Batch)
		g.mu.Unlock()
		b.lead(g, batch)
	} else {
		c.queued = true
		g.pending = append(g.pending, c)
		g.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			g.mu.Lock()
			if i := slices.Index(g.pending, c); i >= 0 {
				g.pending = slices.Delete(g.pending, i, i+1)
				g.active--
				g.mu.Unlock()
				*c = call{done: c.done}
				callPool.Put(c)
				return [5]int64{}, fmt.Errorf("%w: %v", store.ErrUnavailable, ctx.Err())
			}
			g.mu.Unlock()
			<-c.done // already in a batch: it answers within the timeout
		}
		if c.batch != nil {
			batch := c.batch
			c.batch = nil
			b.lead(g, batch)
		}
	}
	res, err := c.res, c.err
	*c = call{done: c.done}
	callPool.Put(c)
	if err == nil && res[0] == -1 {
		err = fmt.Errorf("%w: the step on %s failed on Redis (a foreign value under the key?)", store.ErrUnavailable, key)
	}
	return res, err
}

// take returns first and up to size-1 pending calls as a batch. g.mu must
// be held.
func (g *group) take(first *call, size int) []*call {
	n := min(len(g.pending), size-1)
	if n == 0 {
		first.one[0] = first
		return first.one[:]
	}
	batch := make([]*call, 0, n+1)
	batch = append(batch, first)
	batch = append(batch, g.pending[:n]...)
	rest := copy(g.pending, g.pending[n:])
	clear(g.pending[rest:])
	g.pending = g.pending[:rest]
	return batch
}

// lead sends batch (its first call is the caller's), hands the results to
// the other callers, and passes the in-flight turn on to the next waiting
// call, if any.
func (b *batcher) lead(g *group, batch []*call) {
	b.exec(batch)
	for _, c := range batch[1:] {
		c.done <- struct{}{}
	}
	g.mu.Lock()
	g.active -= len(batch)
	if len(g.pending) == 0 {
		g.inflight--
		g.mu.Unlock()
		return
	}
	next := g.pending[0]
	g.pending = g.pending[1:]
	next.batch = g.take(next, b.l.s.opts.Batch)
	g.mu.Unlock()
	next.done <- struct{}{}
}

// exec runs one batch under the store's breaker, with the deadline of its
// oldest call. The batch serves many callers, so no one caller's context
// cancels it: each caller waits at most Options.Timeout and
// Options.ReplyGrace from its arrival, and Redis does nothing with a batch
// it reaches later than Options.Timeout after its sending (or than that
// bound).
func (b *batcher) exec(batch []*call) {
	s := b.l.s
	fail := func(err error) {
		for _, c := range batch {
			c.err = err
		}
	}
	br := s.breakerFor(batch[0].key) // one slot, one master
	cn := s.conn.Load()
	if cn == nil || br.held() {
		s.maybeProbe(br)
		fail(br.unavailable())
		return
	}
	// The oldest caller gives up the timeout and the grace after it
	// arrived. Redis must reach the batch within the timeout of its
	// sending (and before that): what this process adds, queued before
	// the sending or reading the reply after it, is the grace's, and a
	// stall of this host is not taken for Redis being slow. Without
	// expiries Redis cannot tell a timely call from a late one: no grace.
	grace := s.opts.ReplyGrace
	if s.noExpiry {
		grace = 0
	}
	now := clock.Now()
	left := oldestArrival(batch).Add(s.opts.Timeout + grace).Sub(now)
	if left <= 0 {
		// Queued past the timeout and the grace (the client is starved,
		// or the batch before was slow): these fail, but they are no
		// news about Redis.
		fail(fmt.Errorf("%w: queued past the %v timeout and its %v grace", store.ErrUnavailable, s.opts.Timeout, grace))
		return
	}
	// Redis' share: the timeout, less what the reply needs to come back
	// before the callers give up (up to the grace, at most half of what
	// is left), so that Redis does not run a call whose caller has failed.
	window := min(s.opts.Timeout, left-min(grace, left/2))
	wall := time.Now()
	dl, wait := wall.Add(window), wall.Add(left)
	failed := func(err error) { s.failedWithin(br, err, window) }
	if !s.noExpiry {
		if err := s.learnClock(context.Background(), dl, cn, br, batch[0].key, failed); err != nil {
			fail(err)
			return
		}
	}
	script, width, keys, args := b.call(batch, br.expiry(now, window))
	vals, err := s.exec(context.Background(), wait, cn, script, keys, args).AsIntSlice()
	switch {
	case err == nil && len(vals) >= 2 && vals[0] == -2 && (len(vals) == 2 || len(batch) == 1):
		br.observe(vals[len(vals)-1], now, clock.Now(), s.quick()) // reached after its expiry: did nothing
		err = errLate
	case err == nil && len(vals) != width*len(batch)+1:
		err = fmt.Errorf("batch script returned %d values for %d steps", len(vals), len(batch))
	case err == nil:
		br.observe(vals[len(vals)-1], now, clock.Now(), s.quick())
	}
	if err != nil {
		failed(err)
		fail(fmt.Errorf("%w: %v", store.ErrUnavailable, err))
		return
	}
	for i, c := range batch {
		copy(c.res[:], vals[width*i:width*i+width])
	}
}

// failedWithin counts err of a call that Redis had window to run against
// br's node. A timeout, or a reply that Redis reached the call after its
// window, counts only when the window was at least half the timeout: a
// window this process shortened by queueing says nothing about Redis.
func (s *Store) failedWithin(br *breaker, err error, window time.Duration) {
	if (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errLate)) && 2*window < s.opts.Timeout {
		return
	}
	s.failed(context.Background(), br, err)
}

// oldestArrival is when the batch's oldest call arrived.
func oldestArrival(batch []*call) clock.Instant {
	oldest := batch[0].arrived
	for _, c := range batch[1:] {
		oldest = min(oldest, c.arrived)
	}
	return oldest
}

// call is the script the batch runs, the width of each step's answer, and
// its keys and arguments. One step alone, as a caller alone sends, runs
// the algorithm's own script, which costs Redis less than the batch's loop
// and per-step wrapper around it (a step answers the same either way: the
// batch runs the same body).
func (b *batcher) call(batch []*call, expiry string) (script *rueidis.Lua, width int, keys, args []string) {
	if len(batch) > 1 {
		keys, args = b.args(batch, expiry)
		return b.script, b.l.width(), keys, args
	}
	c := batch[0]
	keys, args = []string{c.key}, b.l.args(c.op, c.cost, stepExtra(c))
	if !b.l.s.noExpiry {
		args[len(args)-1] = expiry
	}
	return b.l.script, 5, keys, args
}

// stepExtra is a step's extra argument; for a paced step that waited for
// a batch, with the deadline budget it has left.
func stepExtra(c *call) string {
	if c.budget > 0 && c.queued {
		return strconv.FormatInt(max(c.budget-int64(clock.Now().Sub(c.arrived)), 1), 10)
	}
	return c.extra
}

// args returns a batch's keys and script arguments (see batchSource).
func (b *batcher) args(batch []*call, expiry string) (keys, args []string) {
	l := b.l
	keys = make([]string, len(batch))
	args = make([]string, 0, 3+l.width()*len(batch))
	now := "0"
	if l.now != nil {
		now = strconv.FormatInt(l.now(), 10)
	}
	if l.s.noExpiry {
		expiry = "0"
	}
	args = append(args, now, expiry, l.fixed[0])
	if l.counter {
		for i, c := range batch {
			keys[i] = c.key
			cost := max(c.cost, 0)
			if c.op == "refund" {
				cost = -cost
			}
			args = append(args, strconv.FormatInt(cost, 10))
		}
		return keys, args
	}
	for i, c := range batch {
		keys[i] = c.key
		args = append(args, c.op, strconv.FormatInt(c.cost, 10), stepExtra(c))
	}
	return keys, args
}

// keySlot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash tag
// (the part between the first '{' and the next '}', when not empty) modulo
// 16384.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
