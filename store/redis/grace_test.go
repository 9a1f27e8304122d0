package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/internal/stall"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// relay is a TCP relay to Redis that can hold back what goes either way:
// requests (Redis reaches a call late, as when Redis or the way to it is
// slow) or replies (Redis ran the call in time and this process gets the
// answer late, as when its host stalls).
type relay struct {
	addr       string
	req, reply atomic.Int64 // delays, ns

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startRelay(t *testing.T, upstream string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), ln: ln}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, u)
			r.mu.Unlock()
			r.wg.Go(func() { pipe(u, c, &r.req) })
			r.wg.Go(func() { pipe(c, u, &r.reply) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// pipe copies src to dst, each read held back by *delay.
func pipe(dst, src net.Conn, delay *atomic.Int64) {
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			time.Sleep(time.Duration(delay.Load()))
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A reply that Redis sent in time and this process got late (its host
// stalled) decides the call, within the store's grace; a call that Redis
// reached after its timeout did nothing, and fails. Without a grace, the
// late reply is a failure, as a timeout always was: the tokens it took stay
// taken and the caller's failure policy decides.
func TestLateReplyOfATimelyCallDecides(t *testing.T) {
	srv := redistest.Start(t)
	rl := startRelay(t, srv.Addr)
	// late: within the timeout and the default grace (200 ms), by margin.
	const timeout, late = 100 * time.Millisecond, 150 * time.Millisecond
	const margin = 2*timeout - late
	meter := stall.Start()
	defer meter.Stop()
	tb := must(limit.NewTokenBucket(must(limit.NewRate(1, time.Hour)), 1000)) // no refill in the test
	ctx := context.Background()
	for _, grace := range []time.Duration{0, -1} { // the default (the timeout), and none
		st, err := New(Options{Addrs: []string{rl.addr}, Timeout: timeout, ReplyGrace: grace, ProbeEvery: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		lim := st.Limiter(must(tokenBucketSpec("grace", tb)))
		key := "k" + grace.String()
		remaining := int64(1000)
		take := func() (limit.Result, error) {
			res, _, err := lim.Take(ctx, key, 0, 1, 0)
			return res, err
		}
		if res, err := take(); err != nil || res.Remaining != remaining-1 {
			t.Fatalf("grace %v: first take: %+v, %v", grace, res, err)
		}
		remaining--

		// The reply comes late: Redis took the token.
		rl.reply.Store(int64(late))
		for attempt := 1; ; attempt++ {
			meter.Reset()
			res, err := take()
			remaining-- // taken on Redis either way: it ran the call in time
			switch {
			case grace == 0 && err == nil && res.Remaining == remaining:
			case grace == 0 && meter.Max() > margin/2 && attempt < 5:
				continue // this host stalled past the grace: try again
			case grace == 0:
				t.Errorf("a reply Redis sent in time, %v late: %+v, %v (longest stall %v)", late, res, err, meter.Max())
			case !errors.Is(err, store.ErrUnavailable):
				t.Errorf("without a grace, a reply %v late: %+v, %v; want ErrUnavailable", late, res, err)
			}
			break
		}
		rl.reply.Store(0)
		waitAnswers(t, take, &remaining)

		// The request comes late: Redis reached it after its timeout and
		// did nothing.
		rl.req.Store(int64(late))
		if res, err := take(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("grace %v: a call Redis reached %v late: %+v, %v; want ErrUnavailable", grace, late, res, err)
		}
		rl.req.Store(0)
		waitAnswers(t, take, &remaining)
		st.Close()
	}
}

// waitAnswers takes until the store answers again (its breaker may have
// opened) and checks that the answer counts from *remaining: a failed
// call took nothing beyond what the caller counted.
func waitAnswers(t *testing.T, take func() (limit.Result, error), remaining *int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := take()
		if err == nil {
			*remaining--
			if res.Remaining != *remaining {
				t.Errorf("%d remaining, want %d", res.Remaining, *remaining)
				*remaining = res.Remaining
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer 10 s on: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Replies read late (this process stalled) do not start a new estimate of
// Redis' clock: if they did, every call after one would carry an expiry
// early by the stall, and Redis would refuse calls it reached in time.
func TestLateRepliesLeaveTheClockEstimate(t *testing.T) {
	srv := redistest.Start(t)
	rl := startRelay(t, srv.Addr)
	const timeout, late = 100 * time.Millisecond, 150 * time.Millisecond
	st, err := New(Options{Addrs: []string{rl.addr}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := st.Limiter(must(tokenBucketSpec("skew", must(limit.NewTokenBucket(limit.PerSecond(1000), 1000)))))
	take := func() error { _, _, err := lim.Take(context.Background(), "k", 0, 1, 0); return err }
	if err := take(); err != nil {
		t.Fatal(err)
	}
	// A stall of this host longer than the margin (the late reply comes
	// 50 ms before the grace ends) fails a call for its own reason: such
	// a round is run again.
	meter := stall.Start()
	defer meter.Stop()
	for round, tries := 0, 0; round < 2; round++ {
		time.Sleep(1100 * time.Millisecond) // the next reply would start a new second's estimate
		meter.Reset()
		var errs []string
		rl.reply.Store(int64(late))
		for i := range 3 {
			if err := take(); err != nil {
				errs = append(errs, fmt.Sprintf("a reply read %v late, call %d: %v", late, i, err))
			}
		}
		rl.reply.Store(0)
		if err := take(); err != nil {
			errs = append(errs, fmt.Sprintf("the call after replies read late: %v", err))
		}
		if len(errs) > 0 && meter.Max() > 25*time.Millisecond && tries < 5 {
			tries++
			round--
			continue
		}
		for _, e := range errs {
			t.Errorf("round %d: %s (longest stall %v)", round, e, meter.Max())
		}
	}
}

// A batch that waited in this process is sent while its callers still
// wait, and Redis is given only what leaves its reply the time to come
// back before they give up: it runs a call whose reply comes back in
// time, and refuses one it reaches later.
func TestQueuedBatchLeavesItsReplyTime(t *testing.T) {
	srv := redistest.Start(t)
	rl := startRelay(t, srv.Addr)
	const timeout = 100 * time.Millisecond // and as much grace
	st, err := New(Options{Addrs: []string{rl.addr}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := st.Limiter(must(tokenBucketSpec("queued", must(limit.NewTokenBucket(must(limit.NewRate(1, time.Hour)), 1000))))).(*limiter)
	remaining := func() int64 {
		res, _, err := l.Take(context.Background(), "k", 0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res.Remaining
	}
	queued := func() error {
		// Queued 120 ms: 80 ms left, of which Redis gets 40.
		c := &call{key: l.stateKey("k"), op: "take", cost: 1, extra: "0", queued: true,
			arrived: clock.Now().Add(-120 * time.Millisecond), done: make(chan struct{}, 1)}
		c.one[0] = c
		l.batcher.exec(c.one[:])
		return c.err
	}
	// A stall of this host longer than the margins (20 ms and more) moves
	// the call past them for its own reason: such a case is run again.
	meter := stall.Start()
	defer meter.Stop()
	for _, tc := range []struct {
		name       string
		req, reply time.Duration
		took       int64
	}{
		{"reply back in time", 0, 25 * time.Millisecond, 1},
		{"reached after Redis' share", 60 * time.Millisecond, 0, 0},
	} {
		for tries := 0; ; tries++ {
			before := remaining()
			meter.Reset()
			rl.req.Store(int64(tc.req))
			rl.reply.Store(int64(tc.reply))
			err := queued()
			rl.req.Store(0)
			rl.reply.Store(0)
			took := before - remaining() - 1
			if took == tc.took && (err == nil) == (tc.took == 1) {
				break
			}
			if meter.Max() > 10*time.Millisecond && tries < 5 {
				continue
			}
			t.Errorf("%s: the queued call answered %v and took %d token(s), want %d (longest stall %v)", tc.name, err, took, tc.took, meter.Max())
			break
		}
	}
}

// A grace or timeout too large to add up is held to an hour.
func TestHugeReplyGrace(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Duration(1<<63 - 1), ReplyGrace: time.Duration(1<<63 - 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Timeout(); got != 2*time.Hour {
		t.Errorf("Timeout() = %v, want 2h", got)
	}
	lim := st.Limiter(must(tokenBucketSpec("huge", must(limit.NewTokenBucket(limit.PerSecond(10), 10)))))
	if _, _, err := lim.Take(context.Background(), "k", 0, 1, 0); err != nil {
		t.Error(err)
	}
}

// A store made by Share keeps every option it is given, ReplyGrace among
// them (it used to take the default grace whatever it was given).
func TestShareKeepsItsOptions(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 40 * time.Millisecond
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: timeout, ReplyGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, grace := range []time.Duration{-1, 120 * time.Millisecond} {
		sh, err := st.Share(Options{Addrs: []string{srv.Addr}, Timeout: timeout, ReplyGrace: grace, Batch: 7, Prefix: "other"})
		if err != nil {
			t.Fatal(err)
		}
		want := timeout + max(grace, 0)
		if sh.Timeout() != want || sh.opts.Batch != 7 || sh.opts.Prefix != "other" {
			t.Errorf("Share with grace %v: Timeout() %v (want %v), batch %d, prefix %q", grace, sh.Timeout(), want, sh.opts.Batch, sh.opts.Prefix)
		}
		sh.Close()
	}
}

// A batch that queued in this process until little of its callers' wait
// was left gives Redis a short window; Redis reaching it after that window
// is no news about Redis, as a timeout within it is not: neither counts as
// a failure of the store (nor starts a check of the node).
func TestQueuedLateIsNoRedisFailure(t *testing.T) {
	srv := redistest.Start(t)
	rl := startRelay(t, srv.Addr)
	const timeout = 50 * time.Millisecond // and as much grace
	st, err := New(Options{Addrs: []string{rl.addr}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := st.Limiter(must(tokenBucketSpec("q", must(limit.NewTokenBucket(limit.PerSecond(1000), 1000))))).(*limiter)
	if _, _, err := l.Take(context.Background(), "k", 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	// Queued 92 of its 100 ms: Redis' window is 4 ms, and the request
	// takes 6 ms to reach Redis (errLate) or 20 ms (the wait times out).
	for _, delay := range []time.Duration{6 * time.Millisecond, 20 * time.Millisecond} {
		before := st.Failures()
		rl.req.Store(int64(delay))
		c := &call{key: l.stateKey("k"), op: "take", cost: 1, extra: "0", queued: true,
			arrived: clock.Now().Add(-92 * time.Millisecond), done: make(chan struct{}, 1)}
		c.one[0] = c
		l.batcher.exec(c.one[:])
		rl.req.Store(0)
		if c.err == nil {
			t.Fatalf("request %v late: the call succeeded", delay)
		}
		if n := st.Failures() - before; n != 0 {
			t.Errorf("request %v late (%v): %d failure(s) counted against Redis, want 0", delay, c.err, n)
		}
	}
}

// Where every reply is slower than quick (a distant Redis), the clock
// estimate still follows Redis' clock when it falls behind: an estimate no
// quick reply renewed starts again from a slow one after staleEstimate.
func TestClockEstimateFollowsASlowRedisBack(t *testing.T) {
	var b breaker
	const quick, rtt = 25 * time.Millisecond, 30 * time.Millisecond
	start := clock.Instant(10 * time.Second)
	redisAt := func(at clock.Instant, behind int64) int64 { return 5_000_000_000 + int64(at-start)/1000 - behind }
	b.observe(redisAt(start, 0), start-clock.Instant(time.Millisecond), start, quick)
	truth := b.offset.Load()
	// Redis' clock falls 100 ms behind (a failover to a host whose clock
	// is behind); every reply takes 30 ms, Redis running the call midway.
	for i := 1; i <= 60; i++ {
		at := start + clock.Instant(time.Duration(i)*time.Second)
		b.observe(redisAt(at-clock.Instant(rtt/2), 100_000), at-clock.Instant(rtt), at, quick)
	}
	// The estimate is a lower bound: at most the round trip under the
	// truth, never above it.
	if got, want := b.offset.Load(), truth-100_000; got > want || got < want-rtt.Microseconds() {
		t.Errorf("the estimate is %d µs from Redis' clock a minute after it fell back, want within [-%d, 0]", got-want, rtt.Microseconds())
	}
}
