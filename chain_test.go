package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rateGate(t testing.TB, name, rate string, burst int64, scope sluice.Scope) sluice.Gate {
	t.Helper()
	r, err := limit.ParseRate(rate)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := limit.NewTokenBucket(r, burst)
	if err != nil {
		t.Fatal(err)
	}
	lim := memory.NewKeyed(tb, memory.Options{})
	g, err := gate.NewRateLimit(name, lim, gate.Options{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	limiterOf.Store(g, lim)
	return g
}

// limiterOf maps the gates the helpers make to their store limiters.
var limiterOf sync.Map

func limiter(g sluice.Gate) store.Limiter {
	l, _ := limiterOf.Load(g)
	return l.(store.Limiter)
}

func concGate(t testing.TB, name string, n int64, scope sluice.Scope) sluice.Gate {
	t.Helper()
	c, err := limit.NewConcurrency(n)
	if err != nil {
		t.Fatal(err)
	}
	lim := memory.NewKeyed(c, memory.Options{})
	g, err := gate.NewInFlight(name, lim, gate.Options{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	limiterOf.Store(g, lim)
	return g
}

type recorder struct {
	mu       sync.Mutex
	decided  []sluice.Decision
	shadow   []string
	outcomes []sluice.Outcome
}

func (r *recorder) Decided(_ *sluice.Request, d *sluice.Decision, _ time.Duration) {
	r.mu.Lock()
	r.decided = append(r.decided, *d)
	r.mu.Unlock()
}

func (r *recorder) ShadowRejected(_ *sluice.Request, d *sluice.Decision) {
	r.mu.Lock()
	r.shadow = append(r.shadow, d.Gate)
	r.mu.Unlock()
}

func (r *recorder) Done(_ *sluice.Request, c sluice.Completion) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, c.Outcome)
	r.mu.Unlock()
}

func TestChainRejectReleasesEarlierPermits(t *testing.T) {
	clk := fakeclock.New(0)
	rate := rateGate(t, "request-rate", "100/s", 500, sluice.ScopeTenant)
	inflight := concGate(t, "concurrent-requests", 1, sluice.ScopeTenant)
	c, err := sluice.NewChain(sluice.ChainOptions{Clock: clk}, rate, inflight)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := sluice.Request{Tenant: "acme"}
	d1, t1 := c.Decide(ctx, &req)
	// The tightest limit describes an admitted request: 0 of 1 slots left.
	if !d1.Admitted || d1.Gate != "concurrent-requests" || d1.Remaining != 0 {
		t.Fatalf("%+v", d1)
	}
	d2, t2 := c.Decide(ctx, &req)
	if d2.Admitted || d2.Reason != sluice.ReasonConcurrency || d2.Gate != "concurrent-requests" || t2.Valid() {
		t.Fatalf("%+v", d2)
	}
	if !d2.Entitlement() || d2.EffectPossible {
		t.Fatalf("tenant concurrency must be an entitlement without effect: %+v", d2)
	}
	// The rate gate refunded the token of the rejected request.
	t1.Done(sluice.OutcomeUseful)
	d3, t3 := c.Decide(ctx, &req)
	if !d3.Admitted {
		t.Fatalf("%+v", d3)
	}
	t3.Done(sluice.OutcomeUseful)
	// Two admitted requests took two tokens; the rejected one was refunded.
	if r, _, _ := limiter(rate).Take(ctx, "acme", 0, 499, 0); r.Status.String() != "denied" || r.Remaining != 498 {
		t.Fatalf("refund missing: %+v", r)
	}
}

func TestChainTightestAdmittedDecision(t *testing.T) {
	clk := fakeclock.New(0)
	wide := rateGate(t, "wide", "1000/s", 1000, sluice.ScopeService)
	narrow := rateGate(t, "narrow", "10/s", 10, sluice.ScopeTenant)
	c, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, wide, narrow)
	d, tk := c.Decide(context.Background(), &sluice.Request{Tenant: "a"})
	defer tk.Done(sluice.OutcomeUseful)
	if d.Gate != "narrow" || d.Remaining != 9 || d.Limit != 10 || d.Window != time.Second {
		t.Fatalf("%+v", d)
	}
}

func TestChainShadowAndOffModes(t *testing.T) {
	clk := fakeclock.New(0)
	rec := &recorder{}
	rate := rateGate(t, "request-rate", "1/s", 1, sluice.ScopeTenant)
	c, err := sluice.NewChain(sluice.ChainOptions{Clock: clk, Observer: rec, Modes: map[string]sluice.Mode{"request-rate": sluice.ModeShadow}}, rate)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := sluice.Request{Tenant: "a"}
	for range 5 {
		d, tk := c.Decide(ctx, &req)
		if !d.Admitted {
			t.Fatalf("shadow mode rejected: %+v", d)
		}
		tk.Done(sluice.OutcomeUseful)
	}
	if len(rec.shadow) != 4 {
		t.Fatalf("%d would-be rejections recorded, want 4", len(rec.shadow))
	}
	// Switch to enforce at run time.
	if err := c.SetMode("request-rate", sluice.ModeEnforce); err != nil {
		t.Fatal(err)
	}
	if d, _ := c.Decide(ctx, &req); d.Admitted {
		t.Fatal("enforce mode admitted over the limit")
	}
	// Kill switch.
	c.SetMode("request-rate", sluice.ModeOff)
	d, tk := c.Decide(ctx, &req)
	if !d.Admitted || d.Gate != "" {
		t.Fatalf("off mode must skip the gate: %+v", d)
	}
	tk.Done(sluice.OutcomeUseful)
	if err := c.SetMode("nope", sluice.ModeOff); !errors.Is(err, sluice.ErrUnknownGate) {
		t.Fatalf("unknown gate: %v", err)
	}
	if m, ok := c.Mode("request-rate"); !ok || m != sluice.ModeOff {
		t.Fatal("mode not reported")
	}
}

func TestChainRejectsInvalidRequestsBeforeGates(t *testing.T) {
	clk := fakeclock.New(10)
	rate := rateGate(t, "r", "1/s", 1, sluice.ScopeTenant)
	c, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, rate)
	ctx := context.Background()
	for _, req := range []sluice.Request{
		{Cost: -1}, {Cost: sluice.MaxCost + 1}, {Cost: -1 << 63},
		{Tenant: string(make([]byte, sluice.MaxKeyLen+1))}, {Deadline: -5},
	} {
		d, tk := c.Decide(ctx, &req)
		if d.Admitted || d.Reason != sluice.ReasonInvalid || d.Retryable || tk.Valid() {
			t.Fatalf("%+v: %+v", req, d)
		}
	}
	d, _ := c.Decide(ctx, &sluice.Request{Deadline: 5})
	if d.Reason != sluice.ReasonDeadline {
		t.Fatalf("expired deadline: %+v", d)
	}
	// Nothing above touched the bucket.
	if d, tk := c.Decide(ctx, &sluice.Request{}); !d.Admitted {
		t.Fatalf("%+v", d)
	} else {
		tk.Done(sluice.OutcomeUseful)
	}
	// Cost above burst: not retryable, no retry-after.
	d, _ = c.Decide(ctx, &sluice.Request{Tenant: "b", Cost: 2})
	if d.Admitted || d.Reason != sluice.ReasonPolicyRate || d.Retryable || d.RetryAfter != 0 {
		t.Fatalf("cost above burst: %+v", d)
	}
}

func TestChainConstructionErrors(t *testing.T) {
	a := rateGate(t, "a", "1/s", 1, sluice.ScopeTenant)
	a2 := rateGate(t, "a", "1/s", 1, sluice.ScopeTenant)
	if _, err := sluice.NewChain(sluice.ChainOptions{}, a, a2); err == nil {
		t.Error("duplicate names accepted")
	}
	if _, err := sluice.NewChain(sluice.ChainOptions{}, a, nil); err == nil {
		t.Error("nil gate accepted")
	}
	if _, err := sluice.NewChain(sluice.ChainOptions{Modes: map[string]sluice.Mode{"zz": sluice.ModeOff}}, a); err == nil {
		t.Error("mode for an unknown gate accepted")
	}
	many := make([]sluice.Gate, sluice.MaxGates+1)
	for i := range many {
		many[i] = rateGate(t, fmt.Sprint("g", i), "1/s", 1, sluice.ScopeTenant)
	}
	if _, err := sluice.NewChain(sluice.ChainOptions{}, many...); err == nil {
		t.Error("too many gates accepted")
	}
}

func TestTicketDoneExactlyOnce(t *testing.T) {
	clk := fakeclock.New(0)
	rec := &recorder{}
	inflight := concGate(t, "inflight", 1, sluice.ScopeService)
	c, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk, Observer: rec}, inflight)
	ctx := context.Background()
	d, tk := c.Decide(ctx, &sluice.Request{})
	if !d.Admitted {
		t.Fatal(d)
	}
	cp := tk
	if !tk.Done(sluice.OutcomeUseful) || tk.Done(sluice.OutcomeUseful) || cp.Done(sluice.OutcomeErrored) {
		t.Fatal("Done released more than once")
	}
	if (sluice.Ticket{}).Done(sluice.OutcomeUseful) {
		t.Fatal("zero ticket released")
	}
	// The recycled ticket serves the next request; the stale copy must not
	// release it.
	d2, tk2 := c.Decide(ctx, &sluice.Request{})
	if !d2.Admitted {
		t.Fatal("slot not released")
	}
	if cp.Done(sluice.OutcomeUseful) {
		t.Fatal("stale copy released a recycled ticket")
	}
	if d3, _ := c.Decide(ctx, &sluice.Request{}); d3.Admitted {
		t.Fatal("limit 1 admitted two")
	}
	tk2.Done(sluice.OutcomeCancelled)
	if len(rec.outcomes) != 2 || rec.outcomes[0] != sluice.OutcomeUseful || rec.outcomes[1] != sluice.OutcomeCancelled {
		t.Fatalf("outcomes %v", rec.outcomes)
	}
}

func TestTicketLateOutcome(t *testing.T) {
	clk := fakeclock.New(0)
	rec := &recorder{}
	c, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk, Observer: rec}, concGate(t, "x", 5, sluice.ScopeService))
	_, tk := c.Decide(context.Background(), &sluice.Request{Deadline: clock.Instant(100 * time.Millisecond)})
	clk.Advance(150 * time.Millisecond)
	tk.Done(sluice.OutcomeUseful)
	if rec.outcomes[0] != sluice.OutcomeLate {
		t.Fatalf("useful after the deadline counted as %v", rec.outcomes[0])
	}
}

// 1,000 goroutines with random panics and context cancellations never
// exceed the concurrency limits and leave zero permits held.
func TestChainConcurrencyStressWithPanicsAndCancellations(t *testing.T) {
	const perTenant, total = 10, 25
	tenantGate := concGate(t, "tenant-inflight", perTenant, sluice.ScopeTenant)
	serviceGate := concGate(t, "service-inflight", total, sluice.ScopeService)
	rate := rateGate(t, "rate", "1e6/s", 1e6, sluice.ScopeTenant)
	c, err := sluice.NewChain(sluice.ChainOptions{}, rate, tenantGate, serviceGate)
	if err != nil {
		t.Fatal(err)
	}
	var inTotal atomic.Int64
	var inTenant [4]atomic.Int64
	var admitted, rejected, panicked, cancelled atomic.Int64
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					panicked.Add(1)
				}
			}()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tenant := i % 4
			req := sluice.Request{Tenant: fmt.Sprint("tenant-", tenant)}
			d, _ := c.Do(ctx, &req, func(ctx context.Context) error {
				n := inTotal.Add(1)
				m := inTenant[tenant].Add(1)
				defer inTotal.Add(-1)
				defer inTenant[tenant].Add(-1)
				if n > total || m > perTenant {
					t.Errorf("in flight %d total, %d for the tenant", n, m)
				}
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				switch rand.IntN(5) {
				case 0:
					panic("handler bug")
				case 1:
					cancel()
					<-ctx.Done()
					cancelled.Add(1)
					return ctx.Err()
				}
				return nil
			})
			if d.Admitted {
				admitted.Add(1)
			} else {
				rejected.Add(1)
			}
		}()
	}
	wg.Wait()
	if panicked.Load() == 0 || cancelled.Load() == 0 || rejected.Load() == 0 {
		t.Fatalf("stress did not exercise every path: %d panics, %d cancels, %d rejections", panicked.Load(), cancelled.Load(), rejected.Load())
	}
	// Zero permits held: every slot can be taken again at once.
	ctx := context.Background()
	for tenant := range 4 {
		key := fmt.Sprint("tenant-", tenant)
		for range perTenant {
			if r, _, _ := limiter(tenantGate).Take(ctx, key, 0, 1, 0); !r.OK() {
				t.Fatalf("%s: a permit leaked", key)
			}
		}
	}
	for range total {
		if r, _, _ := limiter(serviceGate).Take(ctx, "", 0, 1, 0); !r.OK() {
			t.Fatal("a service permit leaked")
		}
	}
	t.Logf("admitted %d, rejected %d, panics %d, cancellations %d", admitted.Load(), rejected.Load(), panicked.Load(), cancelled.Load())
}

func TestDoReleasesOnGoexit(t *testing.T) {
	c, _ := sluice.NewChain(sluice.ChainOptions{}, concGate(t, "one", 1, sluice.ScopeService))
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Do(context.Background(), &sluice.Request{}, func(context.Context) error {
			runtime.Goexit() // what t.FailNow does
			return nil
		})
	}()
	<-done
	d, tk := c.Decide(context.Background(), &sluice.Request{})
	if !d.Admitted {
		t.Fatal("the permit leaked on Goexit")
	}
	tk.Done(sluice.OutcomeUseful)
}

// panicGate panics in Decide once armed.
type panicGate struct{ armed atomic.Bool }

func (*panicGate) Name() string { return "buggy" }

func (g *panicGate) Decide(_ context.Context, _ *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	if g.armed.Load() {
		panic("gate bug")
	}
	d.Admitted = true
	return 0
}

func (*panicGate) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// panicObserver panics in Decided once armed.
type panicObserver struct{ armed atomic.Bool }

func (o *panicObserver) Decided(*sluice.Request, *sluice.Decision, time.Duration) {
	if o.armed.Load() {
		panic("observer bug")
	}
}
func (*panicObserver) ShadowRejected(*sluice.Request, *sluice.Decision) {}
func (*panicObserver) Done(*sluice.Request, sluice.Completion)          {}

// A gate or an observer that panics while a request is decided does not
// keep the slots the gates before it took: a concurrency limit of 1 still
// admits once the panics are over, and the panic still reaches the caller.
func TestPanicInDecideGivesBackTheSlots(t *testing.T) {
	for _, where := range []string{"gate", "observer"} {
		t.Run(where, func(t *testing.T) {
			g, o := &panicGate{}, &panicObserver{}
			c, err := sluice.NewChain(sluice.ChainOptions{Observer: o}, concGate(t, "pool", 1, sluice.ScopeService), g)
			if err != nil {
				t.Fatal(err)
			}
			if where == "gate" {
				g.armed.Store(true)
			} else {
				o.armed.Store(true)
			}
			for range 3 {
				func() {
					defer func() {
						if recover() == nil {
							t.Fatal("the panic did not reach the caller")
						}
					}()
					c.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
				}()
			}
			g.armed.Store(false)
			o.armed.Store(false)
			d, tk := c.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
			if !d.Admitted {
				t.Fatalf("after the panics the pool of 1 refused: %v (its slot was kept)", d.Reason)
			}
			tk.Done(sluice.OutcomeUseful)
		})
	}
}

// scriptGate admits or rejects as told, and panics in Release when told.
type scriptGate struct {
	name             string
	admit, panicRels bool
}

func (g *scriptGate) Name() string { return g.name }

func (g *scriptGate) Decide(_ context.Context, _ *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	d.Admitted = g.admit
	if !g.admit {
		d.Reason = sluice.ReasonConcurrency
	}
	return 0
}

func (g *scriptGate) Release(*sluice.Request, sluice.Permit, sluice.Completion) {
	if g.panicRels {
		panic("release bug")
	}
}

// A gate whose Release panics while a rejection gives the earlier permits
// back does not make the chain give them back twice: a concurrency limit
// of 2 with one request in flight admits one more, not two.
func TestPanicInReleaseReleasesOnce(t *testing.T) {
	pool := concGate(t, "pool", 2, sluice.ScopeService)
	// Permits go back in reverse order: the pool's first, then a's, which panics.
	ch, err := sluice.NewChain(sluice.ChainOptions{}, &scriptGate{name: "a", admit: true, panicRels: true}, pool, &scriptGate{name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := sluice.NewChain(sluice.ChainOptions{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	req := func() *sluice.Request { return &sluice.Request{Tenant: "a", Class: "default", Cost: 1} }
	_, first := alone.Decide(context.Background(), req())
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the Release panic did not reach the caller")
			}
		}()
		ch.Decide(context.Background(), req())
	}()
	d1, t1 := alone.Decide(context.Background(), req())
	d2, _ := alone.Decide(context.Background(), req())
	if !d1.Admitted || d2.Admitted {
		t.Fatalf("after the panic, a limit of 2 with 1 in flight admitted %v then %v: want one more only", d1.Admitted, d2.Admitted)
	}
	t1.Done(sluice.OutcomeUseful)
	first.Done(sluice.OutcomeUseful)
}

// A gate whose Release panics while a rejection gives permits back does
// not keep the permits of the gates before it either: they are given
// back after the panic (a pool of 1 admits again).
func TestPanicInReleaseStillReleasesTheEarlierGates(t *testing.T) {
	pool := concGate(t, "pool", 1, sluice.ScopeService)
	// Permits go back in reverse order: a's first, which panics, then the pool's.
	ch, err := sluice.NewChain(sluice.ChainOptions{}, pool, &scriptGate{name: "a", admit: true, panicRels: true}, &scriptGate{name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := sluice.NewChain(sluice.ChainOptions{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the Release panic did not reach the caller")
			}
		}()
		ch.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
	}()
	d, tk := alone.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
	if !d.Admitted {
		t.Fatalf("after the panic the pool of 1 refused: %v (its slot was kept)", d.Reason)
	}
	tk.Done(sluice.OutcomeUseful)
}

// A gate whose Release panics when the work is done does not keep the
// permits of the gates handed back after it: they are handed back before
// the panic reaches the caller (a pool of 1 admits again).
func TestPanicInReleaseAtDoneStillReleasesTheOtherGates(t *testing.T) {
	pool := concGate(t, "pool", 1, sluice.ScopeService)
	// Permits go back in reverse order: b's first, which panics, then the pool's.
	ch, err := sluice.NewChain(sluice.ChainOptions{}, pool, &scriptGate{name: "b", admit: true, panicRels: true})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := sluice.NewChain(sluice.ChainOptions{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	d, tk := ch.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
	if !d.Admitted {
		t.Fatalf("refused: %v", d.Reason)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the Release panic did not reach the caller")
			}
		}()
		tk.Done(sluice.OutcomeUseful)
	}()
	if tk.Valid() || tk.Done(sluice.OutcomeUseful) {
		t.Fatal("a Ticket whose Done panicked can be released again")
	}
	d, tk = alone.Decide(context.Background(), &sluice.Request{Tenant: "a", Class: "default", Cost: 1})
	if !d.Admitted {
		t.Fatalf("after the panic the pool of 1 refused: %v (its slot was kept)", d.Reason)
	}
	tk.Done(sluice.OutcomeUseful)
}
