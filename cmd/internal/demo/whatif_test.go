package demo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/cmd/internal/whatif"
	"github.com/sluice-go/sluice/policy"
)

// withRate is the routes-api policy with its per-tenant bucket at rate
// tokens/s and a burst of one second of it.
func withRate(t *testing.T, rate int) []byte {
	t.Helper()
	const bucket = "rate: 100/s, burst: 500"
	p := string(routesAPI(t))
	if !strings.Contains(p, bucket) {
		t.Fatalf("routes-api.yaml no longer has %q", bucket)
	}
	return []byte(strings.Replace(p, bucket, fmt.Sprintf("rate: %d/s, burst: %d", rate, rate), 1))
}

// whatifDuration is how long each live run of TestWhatifPredictsTheDemo
// lasts: SLUICE_WHATIF_DURATION (docs/whatif.md's hour), else 30 s.
func whatifDuration(t *testing.T) time.Duration {
	if v := os.Getenv("SLUICE_WHATIF_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SLUICE_WHATIF_DURATION: %v", err)
		}
		return d
	}
	return 30 * time.Second
}

// The demo's traffic, recorded: the routes-api model behind the proxy in
// processes of their own, open-loop load at its capacity from ten tenants
// of which one sends most (Zipf, skew 2: 65%), past its per-tenant rate.
// Replayed through the policy that made it, whatif refuses about what the
// recording refused; replayed through the policy with that rate halved, it
// predicts within 5% (10% in a run under ten minutes) what a live run of
// the halved policy refuses, at the
// same time and on the same traffic (one seed: the same requests in the
// same order).
func TestWhatifPredictsTheDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("two live runs over real HTTP")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := whatifDuration(t)
	dir := t.TempDir()
	policies := map[string][]byte{"current": withRate(t, 40), "halved": withRate(t, 20)}
	logs := map[string]string{}
	var wg sync.WaitGroup
	errs := make(chan error, len(policies))
	for name, p := range policies {
		logs[name] = filepath.Join(dir, name+".log")
		f, err := os.Create(logs[name])
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		wg.Go(func() {
			_, err := RunIncident(t.Context(), IncidentOptions{Exe: exe, Policy: p, PolicyName: name + ".yaml", Workers: 4,
				Duration: d, Load: 1, Tenants: 10, Skew: 2, Seed: 42, AccessLog: f})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []whatif.Record {
		recs, st, err := whatif.ReadFile(logs[name], whatif.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Format != whatif.FormatSluice || st.Malformed != 0 || st.Suppressed != 0 {
			t.Fatalf("%s: %+v", name, st)
		}
		return recs
	}
	parse := func(name string) *policy.File {
		f, err := policy.Parse(name+".yaml", policies[name])
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	recorded, live := read("current"), read("halved")
	opts := whatif.Options{RecordedCost: true, Deadline: 500 * time.Millisecond}

	opts.Candidate = parse("current")
	same, err := whatif.Replay(recorded, opts)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	same.WriteTable(&out)
	t.Logf("the current policy on its own recording (%v):\n%s", d, out.String())

	opts.Candidate = parse("halved")
	pred, err := whatif.Replay(recorded, opts)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	pred.WriteTable(&out)
	t.Logf("the halved policy on the current policy's recording:\n%s", out.String())

	// What the halved policy refused live, from its own access log.
	liveRun, err := whatif.Replay(live, opts)
	if err != nil {
		t.Fatal(err)
	}
	liveRefused, liveRate := liveRun.Baseline.Rejected, refusedAt(liveRun.Baseline, "request-rate")
	predRate := refusedAt(pred.Candidate, "request-rate")
	t.Logf("halved, live: %d of %d refused, %d at request-rate; predicted: %d of %d, %d at request-rate",
		liveRefused, len(live), liveRate, pred.Candidate.Rejected, len(recorded), predRate)

	// The two runs sent the same sequence of requests, but not always as
	// many (a busy machine can fall behind): compare shares. The live run
	// is one draw of its own timing (a host stall lets a tenant's tokens
	// refill, or the pool's queue overflow), and 30 s of it holds about
	// 1,300 refusals. A prediction within 5% is asserted over ten minutes
	// or more (docs/whatif.md: the hour), 10% below: seven runs with the
	// machine busy came within 0.8%, but one in CI came to 6% before the
	// upstream model was fitted rather than averaged.
	share := func(n int64, of int) float64 { return float64(n) / float64(of) }
	tol := 0.10
	if d >= 10*time.Minute {
		tol = 0.05
	}
	within := func(p, l float64) bool { return p >= (1-tol)*l && p <= (1+tol)*l }
	if liveRate == 0 || !within(share(predRate, len(recorded)), share(liveRate, len(live))) {
		t.Errorf("request-rate: predicted %.4f of the requests refused, live %.4f (within %.0f%% asked)", share(predRate, len(recorded)), share(liveRate, len(live)), 100*tol)
	}
	if !within(share(pred.Candidate.Rejected, len(recorded)), share(liveRefused, len(live))) {
		t.Errorf("all gates: predicted %.4f of the requests refused, live %.4f (within %.0f%% asked)", share(pred.Candidate.Rejected, len(recorded)), share(liveRefused, len(live)), 100*tol)
	}
	// On its own recording the rate gate's refusals follow the tokens the
	// worker pool's refusals give back, which follow timing. With the
	// timing gates following the recording (--follow), the policy that
	// recorded the log replays it: the rate gate's refusals in count, and
	// nine in ten of them the same requests (the hour: 98.2% and 98.8%).
	opts.Follow = true
	opts.Candidate = parse("current")
	check, err := whatif.Replay(recorded, opts)
	if err != nil {
		t.Fatal(err)
	}
	recRate, sameRate := refusedAt(check.Baseline, "request-rate"), refusedAt(check.Candidate, "request-rate")
	t.Logf("the current policy on its own recording, following: %d refused at request-rate, %d recorded; the same decision for %.2f%% of the requests",
		sameRate, recRate, 100*check.Agreement.Share)
	if recRate == 0 || !within(float64(sameRate), float64(recRate)) {
		t.Errorf("request-rate on its own recording, following: %d refused replayed, %d recorded (within %.0f%% asked)", sameRate, recRate, 100*tol)
	}
	for _, g := range check.Agreement.Gates {
		if g.Gate == "request-rate" && g.Share < 0.9 {
			t.Errorf("request-rate on its own recording, following: %.1f%% the same requests", 100*g.Share)
		}
	}
}

// refusedAt is what run refused at gate, for every reason.
func refusedAt(run whatif.Run, gate string) int64 {
	var n int64
	for _, g := range run.Gates {
		if g.Gate == gate {
			n += g.Rejected
		}
	}
	return n
}

// A slice is judged against the load the upstream owed an answer: a tenant
// refused at its own quota (429) is not part of it, and a slice of nothing
// else passes without a ratio of zero by zero.
func TestIncidentJudgesWithoutQuotaRefusals(t *testing.T) {
	o := IncidentOptions{Settle: time.Second, SettleChange: time.Second, Slice: 2 * time.Second}
	rep := &IncidentReport{Rows: []IncidentRow{
		{T: 0, CapacityRPS: 200, OfferedRPS: 600},
		{T: 1, CapacityRPS: 200, OfferedRPS: 600, QuotaRPS: 500, GoodputRPS: 95},
		{T: 2, CapacityRPS: 200, OfferedRPS: 600, QuotaRPS: 500, GoodputRPS: 95},
		{T: 3, CapacityRPS: 200, OfferedRPS: 50, QuotaRPS: 50},
		{T: 4, CapacityRPS: 200, OfferedRPS: 50, QuotaRPS: 50},
	}}
	rep.judge(&o)
	if !rep.Pass || rep.WorstSlice != 0.95 {
		t.Fatalf("pass %v, worst %v; slices %+v", rep.Pass, rep.WorstSlice, rep.Slices)
	}
	rep.Rows[2].GoodputRPS = 50 // 72.5 of the 100 owed over the slice
	rep.Slices = nil
	rep.judge(&o)
	if rep.Pass {
		t.Fatalf("passed at %v", rep.WorstSlice)
	}
}
