package policy

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/lease"
)

// Two replicas built from one policy on the redis backend share one budget,
// and fall back to limit/replicas each when Redis is gone.
func TestRedisBackendSharesStateAndFallsBack(t *testing.T) {
	srv := redistest.Start(t)
	src := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
service: shared
store: {backend: redis, addrs: [ADDR], timeout: 50ms, probe_every: 100ms, replicas: 2, on_failure: local_fallback}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 10}
`, "ADDR", srv.Addr)
	f, err := Parse("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.SpecText(), "Redis at "+srv.Addr) {
		t.Fatal(f.SpecText())
	}
	a, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	admitted := 0
	for i := range 20 {
		rt := []*Runtime{a, b}[i%2]
		if d, tk := rt.Chain.Decide(ctx, &sluice.Request{Tenant: "acme"}); d.Admitted {
			admitted++
			tk.Done(sluice.OutcomeUseful)
		}
	}
	if admitted != 10 {
		t.Fatalf("two replicas admitted %d, want the shared burst of 10", admitted)
	}
	srv.Kill()
	// Each replica now decides on its local share, burst 10/2 = 5, of
	// which acme had spent its five on a while Redis decided: the outage
	// gives it no fresh burst (it gave one, and a flapping Redis one per
	// flap). Another tenant gets the whole share.
	for _, c := range []struct {
		tenant string
		want   int
	}{{"acme", 0}, {"beta", 5}} {
		if n := admitN(a, c.tenant, 10); n != c.want {
			t.Fatalf("local fallback admitted %s %d, want %d", c.tenant, n, c.want)
		}
	}
}

// What the local fallback admits while Redis is down is owed to Redis and
// charged once it answers again: a tenant that spent its burst in the
// outage finds Redis' bucket spent too, not refilled (each refilled while
// the other spent, and a flapping Redis let a tenant through at twice its
// limit).
func TestRedisIsChargedWhatTheFallbackAdmitted(t *testing.T) {
	srv := redistest.Start(t)
	src := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
store: {backend: redis, addrs: [ADDR], timeout: 50ms, probe_every: 100ms, on_failure: local_fallback}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 10}
`, "ADDR", srv.Addr)
	rt := buildFile(t, []byte(src), nil)
	defer rt.Close()
	admit := func(tenant string, n int) int { return admitN(rt, tenant, n) }
	if n := admit("warm", 1); n != 1 { // Redis has answered once
		t.Fatalf("%d", n)
	}
	srv.Pause()
	if n := admit("beta", 20); n != 10 {
		t.Fatalf("the fallback admitted beta %d times, want its burst of 10", n)
	}
	srv.Resume()
	// Redis decides again once a decision leaves a key there.
	poll.Until(t, 10*time.Second, func() bool {
		admit("probe", 1)
		return strings.Contains(srv.Do("KEYS", "*probe*"), "probe")
	})
	if n := admit("beta", 10); n != 0 {
		t.Fatalf("back on Redis, beta was admitted %d more times, want 0: its burst went in the outage", n)
	}
	if n := admit("fresh", 10); n != 10 {
		t.Fatalf("a tenant that owed nothing: %d admitted, want 10", n)
	}
}

func TestRedisBackendErrors(t *testing.T) {
	for _, c := range []struct{ src, field string }{
		{"version: 1\nstore: {backend: redis}\ngates: [{name: c, kind: concurrency, limit: 1}]\n", "store.addrs"},
		{"version: 1\nstore: {backend: memory, replicas: 3}\ngates: [{name: c, kind: concurrency, limit: 1}]\n", "store.replicas"},
	} {
		_, err := Parse("p.yaml", []byte(c.src))
		var es Errors
		if !asErrors(err, &es) || len(es) != 1 || es[0].Field != c.field {
			t.Errorf("%q: %v", c.src, err)
		}
	}
}

func asErrors(err error, es *Errors) bool {
	e, ok := err.(Errors)
	*es = e
	return ok
}

// 100 reloads that change only the store's timing settings open no new
// connections (before, 100 reloads left 103 connections open for two
// minutes): each new store shares the old one's.
func TestReloadsShareTheRedisConnection(t *testing.T) {
	srv := redistest.Start(t)
	var prev *Runtime
	for i := range 100 {
		f, err := Parse("r.yaml", []byte(strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
store: {backend: redis, addrs: [ADDR], timeout: `+strconv.Itoa(50+i%2)+`ms}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 1/s, burst: 10}
`, "ADDR", srv.Addr)))
		if err != nil {
			t.Fatal(err)
		}
		rt, err := Build(f, prev, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rt.Chain.Decide(context.Background(), &sluice.Request{Tenant: "t"})
		if prev == nil {
			defer rt.Close()
		}
		prev = rt
	}
	info := srv.Do("info", "clients")
	i := strings.Index(info, "connected_clients:")
	n, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(info[i+len("connected_clients:"):], "\n", 2)[0]))
	if n > 5 {
		t.Fatalf("%d connections to Redis after 100 reloads", n)
	}
	t.Logf("%d connections after 100 reloads", n)
}

// Two processes built from one policy with a lease share its rate through
// Redis: after the allocator's learning period each holds half; when one
// shuts down (Close gives its lease back) the other takes the whole rate
// at its next refresh; a reload that drops the gate stops its refreshes.
func TestLeaseSharesTheRateAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	src := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
service: leased
store: {backend: redis, addrs: [ADDR], timeout: 200ms}
gates:
  - name: fleet-rate
    kind: token_bucket
    scope: service
    rate: 1000/s
    burst: 100
    lease: {time: 300ms, refresh: 50ms}
`, "ADDR", srv.Addr)
	f, err := Parse("l.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if spec := f.SpecText(); !strings.Contains(spec, "spent from a lease (300ms, refreshed every 50ms) of the fleet's 1000 units/s") ||
		!strings.Contains(spec, "leased gates (fleet-rate): the grants never sum above the budget") {
		t.Fatalf("spec:\n%s", spec)
	}
	a, err := Build(f, nil, Options{LeaseClient: "process-a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(f, nil, Options{LeaseClient: "process-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rate := func(rt *Runtime) int64 {
		g, _ := sluice.As[*lease.Gate](rt.Chain.Gates()[0])
		return g.ReportState(rt.Chain.Clock().Now()).(lease.GateState).Rate
	}
	// Demand on both, so that each asks for more than half.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, rt := range []*Runtime{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if d, tk := rt.Chain.Decide(context.Background(), &sluice.Request{}); d.Admitted {
					tk.Done(sluice.OutcomeUseful)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
	}
	poll.Until(t, 10*time.Second, func() bool { return rate(a) == 500 && rate(b) == 500 })
	a.Close() // its load keeps coming, and is decided without a lease now
	poll.Until(t, 10*time.Second, func() bool { return rate(b) == 1000 })
	close(stop)
	wg.Wait()
}

// Two processes share a fleet concurrency budget of 10 slots through a
// lease on one Redis, each with a wait queue in front (allowed on redis
// because the leased slots are freed by the process's own releases):
// while one holds what it can the other gets only the rest, never above
// 10 in flight in all, and more once they end.
func TestLeaseSharesSlotsAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	src := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
service: leased
store: {backend: redis, addrs: [ADDR], timeout: 200ms}
gates:
  - name: fleet-pool
    kind: concurrency
    scope: service
    limit: 10
    retry_hint: 100ms
    queue: {max_wait: 1ms}
    lease: {time: 300ms, refresh: 50ms}
`, "ADDR", srv.Addr)
	f, err := Parse("l.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if spec := f.SpecText(); !strings.Contains(spec, "of the fleet's 10 slots") {
		t.Fatalf("spec:\n%s", spec)
	}
	a, err := Build(f, nil, Options{LeaseClient: "process-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Build(f, nil, Options{LeaseClient: "process-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	leased := func(rt *Runtime) lease.GateState {
		g, _ := sluice.As[*lease.Concurrency](rt.Chain.Gates()[0])
		return g.ReportState(rt.Chain.Clock().Now()).(lease.GateState)
	}
	poll.Until(t, 10*time.Second, func() bool { return leased(a).Spending > 0 })
	// a takes what it can (all 10 while the new budget learns; after, b's
	// idle share of one may be kept from it), then b asks for 20 more
	var held []sluice.Ticket
	for deadline := time.Now().Add(time.Second); len(held) < 10 && time.Now().Before(deadline); {
		if d, tk := a.Chain.Decide(context.Background(), &sluice.Request{}); d.Admitted {
			held = append(held, tk)
		}
	}
	if len(held) < 9 {
		t.Fatalf("a holds %d of 10 (%+v, %+v)", len(held), leased(a), leased(b))
	}
	inA := len(held)
	for range 20 {
		if d, tk := b.Chain.Decide(context.Background(), &sluice.Request{}); d.Admitted {
			held = append(held, tk)
		} else if d.Reason != sluice.ReasonConcurrency && d.Reason != sluice.ReasonQueue {
			t.Fatalf("b turned away with %v, want concurrency or queue", d.Reason)
		}
	}
	if len(held) > 10 {
		t.Fatalf("%d in flight (a %d, b %d) on a fleet budget of 10 (%+v, %+v)", len(held), inA, len(held)-inA, leased(a), leased(b))
	}
	for _, tk := range held {
		tk.Done(sluice.OutcomeUseful)
	}
	poll.Until(t, 10*time.Second, func() bool {
		d, tk := b.Chain.Decide(context.Background(), &sluice.Request{})
		if d.Admitted {
			tk.Done(sluice.OutcomeUseful)
		}
		return d.Admitted
	})
}

// A runtime prepared with other store settings and then discarded (a
// reload refused after its build) leaves the serving runtime's store
// open: the build scheduled the old store's close as soon as it opened
// the new one, so the serving policy lost Redis two minutes after a
// refused reload. The old store closes only once a successor starts.
func TestDiscardedStoreChangeKeepsTheServingStore(t *testing.T) {
	srv := redistest.Start(t)
	defer func(d time.Duration) { retireStoreAfter = d }(retireStoreAfter)
	retireStoreAfter = 10 * time.Millisecond
	parse := func(timeout int) *File {
		f, err := Parse("r.yaml", []byte(strings.ReplaceAll(`version: 1
store: {backend: redis, addrs: [ADDR], timeout: `+strconv.Itoa(timeout)+`ms}
gates:
  - {name: rate, kind: token_bucket, scope: service, rate: 1/s, burst: 10}
`, "ADDR", srv.Addr)))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	clients := func() int {
		info := srv.Do("info", "clients")
		i := strings.Index(info, "connected_clients:")
		n, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(info[i+len("connected_clients:"):], "\n", 2)[0]))
		return n
	}
	before := clients()
	serving, err := Build(parse(50), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	refused, err := Prepare(parse(60), serving, Options{})
	if err != nil {
		t.Fatal(err)
	}
	refused.Discard(serving)
	time.Sleep(100 * time.Millisecond) // ten times the retirement delay
	if err := serving.redis.st.Ping(context.Background()); err != nil {
		t.Fatalf("the serving store after a discarded store change: %v", err)
	}
	// A successor that starts shares the connection; the old store closes
	// after the delay, so once the successor closes too the connection
	// is gone.
	next, err := Build(parse(70), serving, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := next.redis.st.Ping(context.Background()); err != nil {
		t.Fatalf("the successor's store: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	next.Close()
	poll.Until(t, 5*time.Second, func() bool { return clients() <= before })
}

// A reload that gives the store new settings (here its timeout, so a new
// store shares the connection; a rotated password or new addresses open
// another) moves the gates onto the new store, though the gates themselves
// did not change: they were kept on the old store, which closes a while
// after its successor starts, and from then on every decision went to the
// failure policy.
func TestGatesFollowANewStore(t *testing.T) {
	srv := redistest.Start(t, "--user", "a", "on", ">pa", "~*", "&*", "+@all", "--user", "b", "on", ">pb", "~*", "&*", "+@all")
	defer func(d time.Duration) { retireStoreAfter = d }(retireStoreAfter)
	retireStoreAfter = 10 * time.Millisecond
	t.Setenv("SLUICE_TEST_PA", "pa")
	t.Setenv("SLUICE_TEST_PB", "pb")
	parse := func(timeout int, user string) *File {
		f, err := Parse("r.yaml", []byte(strings.ReplaceAll(`version: 1
store: {backend: redis, addrs: [ADDR], timeout: `+strconv.Itoa(timeout)+`ms, on_failure: fail_closed, username: `+user+`, password_env: SLUICE_TEST_P`+strings.ToUpper(user)+`}
gates:
  - {name: rate, kind: token_bucket, scope: service, rate: 1/h, burst: 10}
`, "ADDR", srv.Addr)))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	rt, err := Build(parse(500, "a"), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		timeout int
		user    string
	}{{600, "a"}, {600, "b"}} { // the connection shared; another opened
		next, err := Build(parse(c.timeout, c.user), rt, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rt = next
		time.Sleep(100 * time.Millisecond) // the old store has closed
		d, tk := rt.Chain.Decide(context.Background(), &sluice.Request{})
		if left := int64(9 - i); !d.Admitted || d.Remaining != left {
			t.Fatalf("after reload %d (%+v), the old store closed: %+v, want admitted on Redis with %d left", i+1, c, d, left)
		}
		tk.Done(sluice.OutcomeUseful)
	}
	rt.Close()
}

// A reload that renames the service moves its gates to the new service's
// keys, as a restart does: a fleet whose processes were partly reloaded,
// partly restarted would otherwise spend two budgets.
func TestServiceRenameMovesTheKeys(t *testing.T) {
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "p.yaml")
	src := func(svc string) string {
		return "version: 1\nservice: " + svc + "\nstore:\n  backend: redis\n  addrs: [" + srv.Addr + "]\n  timeout: 1s\n" +
			"gates:\n  - {name: rate, kind: token_bucket, scope: service, rate: 1/h, burst: 10}\n"
	}
	first, err := buildsAndDecides(t, path, src("alpha"), nil, 9)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buildsAndDecides(t, path, src("beta"), first, 9); err != nil { // a fresh bucket: beta's
		t.Fatal(err)
	}
	if keys := srv.Do("KEYS", "sluice:beta*"); keys == "" {
		t.Errorf("no key under sluice:beta after the rename; keys: %q", srv.Do("KEYS", "*"))
	}
}

// A process that starts while its Redis is unreachable, under load, keeps
// fail_open's promise with a bound: until Redis has answered once, each
// replica enforces its share of the limit in memory (before, it admitted
// everything: 829 requests in a second against a 300/s limit on a busy
// host whose Redis was still loading the scripts).
func TestFailOpenIsBoundedUntilRedisAnswers(t *testing.T) {
	f, err := Parse("p.yaml", []byte(`version: 1
store: {backend: redis, addrs: ["127.0.0.1:1"], timeout: 5ms, replicas: 2}
gates:
  - {name: rate, kind: token_bucket, scope: service, rate: 100/s, burst: 20}
`))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	admitted := 0
	start := time.Now()
	for i := 0; i < 200; i++ {
		if d, tk := rt.Chain.Decide(t.Context(), &sluice.Request{}); d.Admitted {
			admitted++
			tk.Done(sluice.OutcomeUseful)
		}
	}
	// One replica's share: 50/s, burst 10: at most 10 plus what 50/s
	// refills while the decisions ran (however slow the machine).
	bound := 10 + int(50*time.Since(start).Seconds()) + 1
	t.Logf("%d of 200 admitted in %v (bound %d)", admitted, time.Since(start), bound)
	if admitted < 10 || admitted > bound {
		t.Fatalf("%d of 200 admitted with Redis unreachable since the start, want at most the replica's share (%d)", admitted, bound)
	}
}

// A reload that changes a Redis gate (or the store's settings) builds its
// fallback over the previous one's state: a fresh, full fallback gave the
// next outage a burst the tenant had spent.
func TestReloadKeepsTheFallbackInStep(t *testing.T) {
	srv := redistest.Start(t)
	src := func(hint string) []byte {
		return []byte(strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
store: {backend: redis, addrs: [ADDR], timeout: 50ms, probe_every: 100ms, on_failure: local_fallback}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 10, retry_hint: `+hint+`}
`, "ADDR", srv.Addr))
	}
	rt1 := buildFile(t, src("1s"), nil)
	if n := admitN(rt1, "acme", 20); n != 10 {
		t.Fatalf("on Redis: %d admitted, want the burst of 10", n)
	}
	rt2 := buildFile(t, src("2s"), rt1) // the gate changed: built anew
	defer rt2.Close()
	rt1.Close()
	srv.Pause()
	defer srv.Resume()
	if n := admitN(rt2, "acme", 10); n != 0 {
		t.Fatalf("an outage after the reload: the fallback admitted %d, want 0 (the burst was spent before it)", n)
	}
}

// admitN decides n requests of tenant on rt's chain, completing each
// admitted one, and returns how many were admitted.
func admitN(rt *Runtime, tenant string, n int) (admitted int) {
	for range n {
		if d, tk := rt.Chain.Decide(context.Background(), &sluice.Request{Tenant: tenant}); d.Admitted {
			admitted++
			tk.Done(sluice.OutcomeUseful)
		}
	}
	return admitted
}

// buildFile parses src as a policy and builds it over prev (nil: none).
func buildFile(t *testing.T, src []byte, prev *Runtime) *Runtime {
	t.Helper()
	f, err := Parse("r.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Build(f, prev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}
