package whatif

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/policy"
	"pgregory.net/rapid"
)

// policyText is a per-tenant token bucket and a service-wide fixed window,
// with rate standing for the bucket's rate.
func policyText(rate string) string {
	return `version: 1
service: whatif-test
identity:
  tenant: {header: X-Api-Key}
routes:
  - {match: {method: POST, path: /v1/routes}, class: critical, cost: 3}
  - {match: {path: "/v1/analytics/*"}, class: sheddable}
gates:
  - {name: tenant-rate, kind: token_bucket, rate: ` + rate + `, burst: 6}
  - {name: service-window, kind: fixed_window, limit: 900, window: 10s}
`
}

func mustPolicy(t testing.TB, name, text string) *policy.File {
	t.Helper()
	f, err := policy.Parse(name, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// clockHandler stamps each log record with the fake clock's time (from
// a fixed epoch), as the real clock would.
type clockHandler struct {
	slog.Handler
	clk   *fakeclock.Clock
	epoch time.Time
}

func (h clockHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Time = h.epoch.Add(time.Duration(h.clk.Now()))
	return h.Handler.Handle(ctx, r)
}

// live serves the traffic through f's gates behind the HTTP middleware on a
// fake clock, with an access log of every decision, and returns the log
// and the refusals by gate.
func live(t *testing.T, f *policy.File) ([]byte, map[string]int) {
	t.Helper()
	clk := fakeclock.New(int64(time.Hour))
	rt, err := policy.Build(f, nil, policy.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	var log bytes.Buffer
	logger := slog.New(clockHandler{Handler: slog.NewJSONHandler(&log, nil), clk: clk, epoch: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)})
	mw, err := httpgate.New(rt.Chain, httpgate.Config{Rules: rt.Rules, AccessLog: &httpgate.AccessLog{Logger: logger, RejectsPerSecond: -1,
		TenantLabel: func(s string) string { return s }}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clk.Advance(3 * time.Millisecond) // the work
	}))
	refused := map[string]int{}
	n := 0
	// Three tenants for a minute: a steady one at 5/s, a heavy one at
	// 20/s, a bursty one sending 30 at once every 10 s; every tenth
	// request is an analytics one, every fifth a costly solve.
	for step := 0; step < 60_000/10; step++ {
		ms := step * 10
		send := func(tenant string, count int) {
			for range count {
				n++
				method, path := "GET", "/v1/routes/42"
				switch {
				case n%10 == 0:
					path = "/v1/analytics/daily"
				case n%5 == 0:
					method, path = "POST", "/v1/routes"
				}
				req := httptest.NewRequest(method, path, nil)
				req.Header.Set("X-Api-Key", tenant)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					refused[gateOf(rec.Body.String())]++
				}
			}
		}
		if ms%200 == 0 {
			send("steady", 1)
		}
		if ms%50 == 0 {
			send("heavy", 1)
		}
		if ms%10_000 == 0 {
			send("bursty", 30)
		}
		clk.Advance(10 * time.Millisecond)
	}
	return log.Bytes(), refused
}

// gateOf is the gate a rejection envelope names.
func gateOf(body string) string {
	const key = `"gate":"`
	i := strings.Index(body, key)
	if i < 0 {
		return ""
	}
	body = body[i+len(key):]
	return body[:strings.IndexByte(body, '"')]
}

// Replayed through the policy that made it, a log of every decision comes
// out decision for decision the same (the rate gates replay exactly on the
// recorded times); replayed through a policy with half the per-tenant
// rate, it predicts within 2% what the halved policy refuses live. (Not
// exactly: live, every admitted request's work moves the clock 3 ms, so
// the halved policy's traffic itself runs a little differently.)
func TestReplayReproducesTheRecordingAndPredictsAChange(t *testing.T) {
	current := mustPolicy(t, "current.yaml", policyText("10/s"))
	halved := mustPolicy(t, "halved.yaml", policyText("5/s"))
	logData, liveCurrent := live(t, current)
	recs, st, err := Read(bytes.NewReader(logData), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Format != FormatSluice || st.Malformed != 0 || st.Suppressed != 0 {
		t.Fatalf("read %+v", st)
	}

	rep, err := Replay(recs, Options{Candidate: current})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
	if rep.Agreement.Share != 1 {
		t.Errorf("the current policy replayed agrees with the recording on %.4f of the requests, want all", rep.Agreement.Share)
	}
	for _, g := range rep.Agreement.Gates {
		if g.Share != 1 {
			t.Errorf("gate %s: %+v", g.Gate, g)
		}
	}
	if rep.Baseline.Rejected != int64(sum(liveCurrent)) || rep.Baseline.Rejected == 0 {
		t.Errorf("the recording has %d refusals, the live run %d", rep.Baseline.Rejected, sum(liveCurrent))
	}

	_, liveHalved := live(t, halved)
	rep, err = Replay(recs, Options{Candidate: halved})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
	within := func(pred, live int64) bool { return 50*abs(pred-live) <= live }
	for _, g := range rep.Candidate.Gates {
		if !within(g.Rejected, int64(liveHalved[g.Gate])) {
			t.Errorf("gate %s: the replay predicts %d refusals, the halved policy refused %d live", g.Gate, g.Rejected, liveHalved[g.Gate])
		}
	}
	t.Logf("halved: %d refusals predicted, %d live", rep.Candidate.Rejected, sum(liveHalved))
	if !within(rep.Candidate.Rejected, int64(sum(liveHalved))) || rep.Candidate.Rejected <= rep.Baseline.Rejected {
		t.Errorf("candidate refuses %d (live %d), recording %d", rep.Candidate.Rejected, sum(liveHalved), rep.Baseline.Rejected)
	}
	if len(rep.Candidate.Tenants) == 0 || rep.Candidate.Tenants[0].Tenant != "heavy" {
		t.Errorf("tenants refused most: %+v", rep.Candidate.Tenants)
	}
}

func abs(v int64) int64 { return max(v, -v) }

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// A log whose timestamps span decades (a bogus line) gets a coarser
// timeline, not one of millions of points.
func TestReplayBoundsTheTimeline(t *testing.T) {
	recs := []Record{{At: 0, Method: "GET", Path: "/", Duration: -1}, {At: int64(50 * 365 * 24 * time.Hour), Method: "GET", Path: "/", Duration: -1}}
	rep, err := Replay(recs, Options{Candidate: mustPolicy(t, "p.yaml", policyText("5/s"))})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rep.Candidate.Timeline); n > maxPoints+1 || rep.Interval < time.Hour {
		t.Errorf("%d points of %v", n, rep.Interval)
	}
}

// served runs arrivals through a first-come first-served upstream of k
// workers (each request to the worker free first) and records them as an
// access log would: arrival and duration.
func served(k int, at []int64, service []time.Duration) []Record {
	free := make([]int64, k)
	recs := make([]Record, len(at))
	for i := range at {
		w := slices.Index(free, slices.Min(free))
		start := max(at[i], free[w])
		free[w] = start + int64(service[i])
		recs[i] = Record{At: at[i], Method: "GET", Path: "/", Duration: time.Duration(free[w] - at[i]), Decision: Admitted}
	}
	return recs
}

// The wait for a worker and the service come apart exactly when the
// number of workers is right: any upstream of k workers, fed any
// arrivals, gives back every request's service time, and needs no fewer
// than k workers that the fit finds (more only when the log cannot show
// them).
func TestFitRecoversTheUpstream(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 32).Draw(t, "workers")
		n := rapid.IntRange(1, 600).Draw(t, "requests")
		at, service := make([]int64, n), make([]time.Duration, n)
		var now int64
		for i := range n {
			now += int64(rapid.IntRange(0, 20_000).Draw(t, "gap µs")) * 1000
			at[i] = now
			service[i] = time.Duration(rapid.IntRange(1, 200_000).Draw(t, "service µs")) * time.Microsecond
		}
		recs := served(k, at, service)
		f := fitUpstream(recs, k)
		if f.late != 0 || !slices.Equal(f.service, service) {
			t.Fatalf("%d workers: %d late; service %v, want %v", k, f.late, f.service, service)
		}
		if got := fitUpstream(recs, 0); got.workers > k {
			t.Fatalf("fitted %d workers to an upstream of %d", got.workers, k)
		}
	})
}

// demoMix is n arrivals (Poisson) at load times the capacity of k workers,
// with service times of the demo's mix: reads (10 ms), writes (20 to 30
// ms) and reports (150 ms), 34 ms on average.
func demoMix(rg *rand.Rand, k int, load float64, n int) ([]int64, []time.Duration) {
	at, service := make([]int64, n), make([]time.Duration, n)
	var now float64
	for i := range n {
		switch x := rg.IntN(10); {
		case x == 0:
			service[i] = 150 * time.Millisecond
		case x < 4:
			service[i] = 20*time.Millisecond + time.Duration(rg.Int64N(int64(10*time.Millisecond)))
		default:
			service[i] = 10 * time.Millisecond
		}
		now += rg.ExpFloat64() * float64(34*time.Millisecond) / (load * float64(k))
		at[i] = int64(now)
	}
	return at, service
}

// capacity is what workers serving these service times complete, requests/s.
func capacity(workers int, service []time.Duration) float64 {
	var sum time.Duration
	for _, s := range service {
		sum += s
	}
	return float64(workers) * float64(len(service)) / sum.Seconds()
}

// An upstream that was seldom full is fitted with fewer workers than it
// had, each faster (docs/whatif.md): the recording cannot show workers it
// never kept busy. 32 workers at 80% of their capacity are found as 23
// to 27, with 72% to 87% of their capacity; at twice it, as 27 or more
// (TestFitFindsTheWorkers).
func TestFitSeldomFull(t *testing.T) {
	rg := rand.New(rand.NewPCG(3, 4))
	for range 3 {
		at, service := demoMix(rg, 32, 0.8, 32*400)
		f := fitUpstream(served(32, at, service), 0)
		share := capacity(f.workers, f.service) / capacity(32, service)
		t.Logf("32 workers at 80%%: fitted %d, %.0f%% of the capacity", f.workers, 100*share)
		if f.workers < 23 || f.workers > 27 || share < 0.72 || share > 0.87 {
			t.Errorf("fitted %d workers, %.2f of the capacity", f.workers, share)
		}
	}
}

// An upstream of reads (10 ms), writes (20 to 30 ms) and reports (150 ms),
// in Poisson arrivals at twice its capacity, is found as it is: fewer
// workers cannot have served the many reads that left early behind a
// report (the fit forgives 1% of requests, as real logs need).
func TestFitFindsTheWorkers(t *testing.T) {
	rg := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{1, 4, 8, 32} {
		n := 200 * k
		at, service := demoMix(rg, k, 2, n)
		f := fitUpstream(served(k, at, service), 0)
		if f.late > n/100 || f.queued == 0 {
			t.Errorf("%d workers: %d late, %d queued", k, f.late, f.queued)
		}
		// Up to 8 workers, exactly; more are hard to see, since a
		// missing one seldom makes a request leave before its start: the
		// fit may find fewer, each serving faster, with the same capacity.
		if k <= 8 && (f.workers != k || !slices.Equal(f.service, service)) {
			t.Errorf("%d workers: fitted %d", k, f.workers)
		}
		if got, want := capacity(f.workers, f.service), capacity(k, service); f.workers < k*8/10 || f.workers > k || math.Abs(got/want-1) > 0.02 {
			t.Errorf("%d workers: fitted %d, %.0f requests/s, want %.0f", k, f.workers, got, want)
		}
		// Told fewer workers than it had, the fit says how many requests
		// left before they could have started.
		if k > 1 {
			if f := fitUpstream(served(k, at, service), k/2); f.late == 0 {
				t.Errorf("%d workers fitted as %d: none late", k, k/2)
			}
		}
	}
	// A recording where nothing ever waited has no model: its upstream
	// may have had any number of workers above what it kept busy.
	at, service := make([]int64, 100), make([]time.Duration, 100)
	for i := range at {
		at[i], service[i] = int64(i)*int64(time.Second), 10*time.Millisecond
	}
	rep, err := Replay(served(4, at, service), Options{Candidate: mustPolicy(t, "p.yaml", policyText("5/s"))})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "no upstream is modeled") {
		t.Errorf("notes: %q", rep.Notes)
	}
	// Refusals and requests without a duration are not served.
	if f := fitUpstream([]Record{{At: 0, Duration: -1}, {At: 1, Duration: time.Second, Decision: Rejected}}, 0); f.workers != 0 || f.served != 0 {
		t.Errorf("%+v", f)
	}
	// Records out of arrival order are refused, not replayed wrong.
	if _, err := Replay([]Record{{At: 2, Duration: -1}, {At: 1, Duration: -1}}, Options{Candidate: mustPolicy(t, "p.yaml", policyText("5/s"))}); err == nil {
		t.Error("records out of order replayed")
	}
}

// The upstream is reached after the decision: a request that waited in a
// gate's queue (Record.Wait) reached it that much after its arrival. Here
// one gate slot held r0 for 100 ms while r1 waited 90 ms in the gate's
// queue: the upstream served both at once, and each for 100 ms.
func TestFitReachesTheUpstreamAfterTheWait(t *testing.T) {
	ms := func(n int) int64 { return int64(n) * int64(time.Millisecond) }
	recs := []Record{
		{At: ms(0), Duration: 100 * time.Millisecond, Decision: Admitted},
		{At: ms(10), Duration: 100 * time.Millisecond, Wait: 90 * time.Millisecond, Decision: Admitted},
	}
	f := fitUpstream(recs, 0)
	if f.queued != 0 || f.late != 0 || !slices.Equal(f.service, []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}) {
		t.Errorf("%+v", f)
	}
}

// Odd recordings and sizes: a number of workers given is kept even where
// nothing waited (the note names the log's most in flight, not it); an
// absurd one allocates nothing absurd; ten requests that arrive and leave
// together cannot have been served one after another in no time, so they
// are not fitted to one worker.
func TestFitOddCases(t *testing.T) {
	cand := mustPolicy(t, "p.yaml", policyText("5/s"))
	one := []Record{{At: 0, Method: "GET", Path: "/", Duration: time.Millisecond, Decision: Admitted}}
	rep, err := Replay(one, Options{Candidate: cand, Workers: 4})
	if err != nil || !strings.Contains(strings.Join(rep.Notes, "\n"), "modeled as 4 workers") {
		t.Errorf("--workers 4: %v %q", err, rep.Notes)
	}
	if _, err := Replay(one, Options{Candidate: cand, Workers: math.MaxInt}); err != nil {
		t.Error(err)
	}
	together := make([]Record, 10)
	for i := range together {
		together[i] = Record{At: 0, Duration: time.Second, Decision: Admitted}
	}
	if f := fitUpstream(together, 0); f.workers != 10 || f.queued != 0 {
		t.Errorf("ten together: %d workers, %d waited", f.workers, f.queued)
	}
}

// An operation is its method and path, identifiers aside.
func TestOperation(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/routes/57336": "GET /v1/routes/*",
		"/v1/routes":       "GET /v1/routes",
		"/v2/users/9f86d081-4e1a-11ee-be56-0242ac120002": "GET /v2/users/*",
		"/v1/reports/2026-12-06/deadbeef1":               "GET /v1/reports/*/*",
		"/v1/analytics/daily":                            "GET /v1/analytics/daily",
		"/cafe/face":                                     "GET /cafe/face",
	} {
		if got := operation(&Record{Method: "GET", Path: path}); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

// A pool serves in arrival order and frees a worker only when no one
// waits.
func TestPoolServesInOrder(t *testing.T) {
	p := pool{workers: 2}
	if !p.take(1) || !p.take(2) || p.take(3) || p.take(4) {
		t.Fatal("two workers: the first two served, the rest wait")
	}
	if p.next() != 3 || p.next() != 4 || p.next() != -1 || p.busy != 1 {
		t.Fatalf("served out of order, or busy %d", p.busy)
	}
}

// --deadline is what each request's deadline header said: the candidate's
// identity reads it, cut to identity.deadline.max, and a policy that reads
// no deadline header never sees one (the proxy would not). It was set as
// the budget directly: 1h with a max of 5ms refused nothing the proxy
// would refuse, and a policy without a deadline header refused requests.
func TestDeadlineGoesThroughTheHeader(t *testing.T) {
	var recs []Record
	for i := range 200 { // 20 ms of work every 100 ms: no queue
		recs = append(recs, Record{At: int64(i) * int64(100*time.Millisecond), Method: "GET", Path: "/a", Tenant: "t",
			Status: 200, Duration: 20 * time.Millisecond, Decision: Admitted})
	}
	const gates = `
gates:
  - {name: in-time, kind: deadline, min_samples: 1}
  - {name: pool, kind: concurrency, limit: 100}
`
	withHeader := mustPolicy(t, "dl.yaml", "version: 1\nidentity:\n  deadline: {header: X-Request-Timeout, max: 5ms}"+gates)
	without := mustPolicy(t, "none.yaml", "version: 1"+gates)
	refused := func(f *policy.File, d time.Duration) (int64, []string) {
		t.Helper()
		rep, err := Replay(recs, Options{Candidate: f, Deadline: d, Workers: -1})
		if err != nil {
			t.Fatal(err)
		}
		return rep.Candidate.Rejected, rep.Notes
	}
	short, _ := refused(withHeader, 5*time.Millisecond)
	if short < 100 {
		t.Fatalf("a 5ms deadline for 20ms of work: %d of 200 refused, want most", short)
	}
	long, notes := refused(withHeader, time.Hour)
	if long != short || !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "cut to the policy's identity.deadline.max, 5ms") }) {
		t.Errorf("1h cut to the max of 5ms: %d refused (5ms: %d), notes %q", long, short, notes)
	}
	none, notes := refused(without, 5*time.Millisecond)
	if none != 0 || !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "reads no deadline header") }) {
		t.Errorf("a policy without a deadline header: %d refused, notes %q; want 0 and a note", none, notes)
	}
	if huge, _ := refused(withHeader, time.Duration(1<<63-1)); huge != short {
		t.Errorf("the longest duration: %d refused, want %d (cut to the max, not overflowed)", huge, short)
	}
}
