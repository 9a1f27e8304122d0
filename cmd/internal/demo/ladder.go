package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/shed"
)

// LadderPolicy is the policy of the load-step scenario: the degradation
// ladder on 8 workers with short time constants, then a fleet-usage gate
// that keeps a third of 12 slots for critical work.
const LadderPolicy = `version: 1
service: routes-api
identity:
  tenant: {header: X-Api-Key}
  deadline: {header: X-Request-Timeout}
routes:
  - {match: {method: POST, path: /v1/routes}, class: critical}
  - {match: {path: "/v1/analytics/*"}, class: sheddable}
gates:
  - name: ladder
    kind: ladder
    workers: 8
    sample_every: 250ms
    min_dwell: 1s
    step_every: 1s
    recover: [25%, 50%, 75%]
    protected: [critical]
  - {name: fleet-usage, kind: fleet_usage, limit: 12, reserve: {critical: 34%}}
`

// LadderPhase is one stretch of sheddable load, as a share of the
// upstream's work capacity.
type LadderPhase struct {
	For   time.Duration
	Share float64
}

// LadderRow is one line of the time series.
type LadderRow struct {
	At              time.Duration
	Level           sluice.Level
	Demand          float64
	SheddableShare  float64
	CriticalOffered int64 // in this interval
	CriticalUseful  int64
}

// LadderReport is the result of the load-step scenario.
type LadderReport struct {
	Rows            []LadderRow
	Transitions     []shed.Transition
	CriticalOffered int64
	CriticalUseful  int64
	Start           clock.Instant // chain clock at the start, for the transitions
}

// RunLadderStep drives the demo upstream through sluice with a steady
// critical stream (25% of capacity: route solves) and a sheddable stream
// (analytics) that follows phases, all open-loop over real HTTP, and
// samples the ladder's level every 250 ms.
func RunLadderStep(ctx context.Context, phases []LadderPhase) (*LadderReport, error) {
	const workers = 8
	_, p, stop, err := behindProxy(ctx, workers, "ladder-step.yaml", []byte(LadderPolicy))
	if err != nil {
		return nil, err
	}
	defer stop()
	s, target := p.s, p.url
	var ladder *shed.Ladder
	for _, g := range s.Chain().Gates() {
		if l, ok := sluice.As[*shed.Ladder](g); ok {
			ladder = l
		}
	}
	clk := s.Chain().Clock()
	rep := &LadderReport{Start: clk.Now()}

	var total time.Duration
	for _, p := range phases {
		total += p.For
	}
	// Critical: 25% of capacity in route solves (mean 50 ms at 150 stops).
	post := ServiceTime(http.MethodPost, "/v1/routes", 150)
	critRate := 0.25 * workers / post.Seconds()
	analytics := ServiceTime(http.MethodGet, "/v1/analytics/daily", 0)

	var mu sync.Mutex
	var critOffered, critUseful int64
	deadline := time.Second
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		atk := vegeta.NewAttacker(vegeta.Timeout(deadline), vegeta.KeepAlive(true), vegeta.MaxWorkers(5000))
		tgt := func(t *vegeta.Target) error {
			t.Method, t.URL = http.MethodPost, target+"/v1/routes"
			t.Header = http.Header{"X-Api-Key": {"critical-tenant"}, "X-Stops": {"150"}, "X-Request-Timeout": {deadline.String()}}
			return nil
		}
		for r := range atk.Attack(tgt, vegeta.ConstantPacer{Freq: int(critRate + 0.5), Per: time.Second}, total, "critical") {
			mu.Lock()
			critOffered++
			if r.Code == http.StatusOK && r.Latency <= deadline {
				critUseful++
			}
			mu.Unlock()
		}
	}()
	var share float64
	var shareMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, p := range phases {
			shareMu.Lock()
			share = p.Share
			shareMu.Unlock()
			rate := p.Share * workers / analytics.Seconds()
			if rate < 1 {
				time.Sleep(p.For)
				continue
			}
			atk := vegeta.NewAttacker(vegeta.Timeout(deadline), vegeta.KeepAlive(true), vegeta.MaxWorkers(5000))
			var n atomic.Int64
			tgt := func(t *vegeta.Target) error {
				t.Method, t.URL = http.MethodGet, target+"/v1/analytics/"+strconv.FormatInt(n.Add(1)%100, 10)
				t.Header = http.Header{"X-Api-Key": {"analytics-tenant"}, "X-Request-Timeout": {deadline.String()}}
				return nil
			}
			for range atk.Attack(tgt, vegeta.ConstantPacer{Freq: int(rate + 0.5), Per: time.Second}, p.For, "sheddable") {
			}
		}
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var lastOffered, lastUseful int64
	for time.Since(start) < total+time.Second {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		st := ladder.State(clk.Now())
		mu.Lock()
		shareMu.Lock()
		rep.Rows = append(rep.Rows, LadderRow{At: time.Since(start).Round(10 * time.Millisecond), Level: st.Level, Demand: st.Pressure,
			SheddableShare: share, CriticalOffered: critOffered - lastOffered, CriticalUseful: critUseful - lastUseful})
		shareMu.Unlock()
		lastOffered, lastUseful = critOffered, critUseful
		mu.Unlock()
	}
	wg.Wait()
	// Quiet after the load: let the ladder finish recovering.
	for i := 0; i < 40 && ladder.State(clk.Now()).Level != sluice.LevelNormal; i++ {
		time.Sleep(250 * time.Millisecond)
		st := ladder.State(clk.Now())
		rep.Rows = append(rep.Rows, LadderRow{At: time.Since(start).Round(10 * time.Millisecond), Level: st.Level, Demand: st.Pressure})
	}
	rep.Transitions = ladder.State(clk.Now()).History
	rep.CriticalOffered, rep.CriticalUseful = critOffered, critUseful
	return rep, nil
}

// WriteTable prints the time series.
func (r *LadderReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%7s %-8s %7s %10s %10s %10s\n", "t", "level", "demand", "sheddable", "crit sent", "crit ok")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%7s %-8s %7.2f %9.0f%% %10d %10d\n", row.At, row.Level, row.Demand, 100*row.SheddableShare, row.CriticalOffered, row.CriticalUseful)
	}
	fmt.Fprintf(w, "transitions:")
	for _, tr := range r.Transitions {
		fmt.Fprintf(w, " %s→%s@%.1fs", tr.From, tr.To, tr.At.Sub(r.Start).Seconds())
	}
	fmt.Fprintf(w, "\ncritical: %d sent, %d useful (%.1f%%)\n", r.CriticalOffered, r.CriticalUseful, 100*float64(r.CriticalUseful)/float64(max(r.CriticalOffered, 1)))
}
