package whatif

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/policy"
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

// The modeled upstream's size is what the recording kept in flight in its
// busy seconds, with service times scaled so that the pool completes as
// much as the recording's upstream did.
func TestCapacityFromTheRecording(t *testing.T) {
	steady := func(every, dur time.Duration, n int) []Record {
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = Record{At: int64(time.Duration(i) * every), Duration: dur, Decision: Admitted}
		}
		return recs
	}
	for _, c := range []struct {
		name    string
		recs    []Record
		workers int
		scale   float64
	}{
		// One every 5 ms for 40 ms each: 8 in flight, 200 a second.
		{"eight", steady(5*time.Millisecond, 40*time.Millisecond, 2000), 8, 1},
		// One every 4 ms for 38 ms each: 9.5 in flight, 250 a second, as
		// 10 workers serving each for 10/9.5 of its duration (40 ms).
		{"nine and a half", steady(4*time.Millisecond, 38*time.Millisecond, 2500), 10, 10 / 9.5},
		// Refusals and requests without a duration are not work.
		{"none", []Record{{At: 0, Duration: -1}, {At: 1, Duration: time.Second, Decision: Rejected}}, 0, 1},
	} {
		w, s := capacity(c.recs)
		if w != c.workers || math.Abs(s-c.scale) > 0.005 {
			t.Errorf("%s: %d workers at %.4f, want %d at %.4f", c.name, w, s, c.workers, c.scale)
		}
	}
	// A request of a day costs two steps of work, not 86,400; a
	// recording that never kept one request in flight has no model.
	day := []Record{{At: 0, Duration: MaxDuration, Decision: Admitted}, {At: int64(time.Hour), Duration: time.Millisecond, Decision: Admitted}}
	if w, _ := capacity(day); w < 1 || w > 2 {
		t.Errorf("a request of a day: %d workers", w)
	}
	if w, _ := capacity(steady(time.Second, 10*time.Millisecond, 100)); w != -1 {
		t.Errorf("a request a second of 10 ms: %d workers, want none (-1)", w)
	}
	// An idle stretch does not lower the estimate: the busy seconds set it.
	recs := append(steady(5*time.Millisecond, 40*time.Millisecond, 2000), steady(time.Second, 10*time.Millisecond, 100)...)
	for i := 2000; i < len(recs); i++ {
		recs[i].At += int64(20 * time.Second)
	}
	if w, s := capacity(recs); w != 8 || math.Abs(s-1) > 0.005 {
		t.Errorf("with an idle stretch: %d workers at %.4f", w, s)
	}
}

// A pool serves in arrival order and frees a worker only when no one
// waits.
func TestPoolServesInOrder(t *testing.T) {
	p := pool{workers: 2, scale: 1}
	if !p.take(1) || !p.take(2) || p.take(3) || p.take(4) {
		t.Fatal("two workers: the first two served, the rest wait")
	}
	if p.next() != 3 || p.next() != 4 || p.next() != -1 || p.busy != 1 {
		t.Fatalf("served out of order, or busy %d", p.busy)
	}
}
