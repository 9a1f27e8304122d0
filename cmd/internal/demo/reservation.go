package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// ReservationPolicy is the policy of the reservation scenario: the
// free and premium example of the Mercury model at a tenth of its scale. The upstream's
// 4 workers serve 400 work units/s (10 ms of worker time per unit; premium
// queries cost 3, free ones 1); 4 units/s are kept back, premium reserves
// 240 units/s and free 156, and a weighted in-flight limit bounds the
// upstream's queue to about 100 ms of work.
const ReservationPolicy = `version: 1
service: mercury
identity:
  tenant: {header: X-Api-Key, required: true}
  deadline: {header: X-Request-Timeout, max: 10s}
routes:
  - {match: {path: "/premium/*"}, class: critical, cost: 3}
  - {match: {path: "/free/*"}, class: sheddable, cost: 1}
gates:
  - name: class-reserve
    kind: reservation
    capacity: 400
    recovery: 4
    revocation: 500ms
    shares:
      critical: {reserve: 240}
      sheddable: {reserve: 156}
  - {name: downstream-inflight, kind: concurrency, scope: service, limit: 40, weighted: true}
`

// ReservationOptions configures the reservation run. The zero value is the
// acceptance run: premium offered 100 queries/s (300 units/s), free 600/s,
// premium down to 40 queries/s in the second phase, 10 s per phase.
type ReservationOptions struct {
	Policy     []byte
	PolicyName string
	Workers    int           // default 4: 400 units/s
	Phase      time.Duration // default 10 s
	Deadline   time.Duration // default 1 s
	Premium    [3]float64    // premium queries/s per phase; default 100, 40, 100
	Free       float64       // free queries/s; default 600
}

func (o *ReservationOptions) defaults() {
	if len(o.Policy) == 0 {
		o.Policy, o.PolicyName = []byte(ReservationPolicy), "reservation.yaml (embedded)"
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.Phase == 0 {
		o.Phase = 10 * time.Second
	}
	if o.Deadline == 0 {
		o.Deadline = time.Second
	}
	if o.Premium == [3]float64{} {
		o.Premium = [3]float64{100, 40, 100}
	}
	if o.Free == 0 {
		o.Free = 600
	}
}

// ClassCounts are one class's work units per second.
type ClassCounts struct {
	Offered  float64 `json:"offered"`
	Admitted float64 `json:"admitted"`
	Useful   float64 `json:"useful"`
}

// ReservationPhase is one phase's per-class means, from its second second
// on (the first is the change itself).
type ReservationPhase struct {
	PremiumRPS float64     `json:"premium_rps"`
	Premium    ClassCounts `json:"premium"`
	Free       ClassCounts `json:"free"`
	// Want are the reservation's promises: premium min(demand, reserve),
	// free what is left of the usable capacity.
	WantPremium float64 `json:"want_premium"`
	WantFree    float64 `json:"want_free"`
	Behind      bool    `json:"load_generator_behind"`
}

// ReservationReport is the reservation run's result.
type ReservationReport struct {
	Policy   string             `json:"policy"`
	Capacity float64            `json:"capacity_units_per_s"`
	Phases   []ReservationPhase `json:"phases"`
	// FirstSecondBack is premium's admitted units in the first second of
	// the last phase (its reserve must be back within the revocation time).
	FirstSecondBack float64 `json:"premium_first_second_back"`
}

// phasedPacer paces at rates[i] during the i-th stretch of length phase.
type phasedPacer struct {
	rates []float64
	phase time.Duration
}

// expected is the number of hits due by elapsed.
func (p phasedPacer) expected(elapsed time.Duration) float64 {
	n := 0.0
	for i, r := range p.rates {
		from := time.Duration(i) * p.phase
		if elapsed <= from {
			break
		}
		n += r * (min(elapsed, from+p.phase) - from).Seconds()
	}
	return n
}

func (p phasedPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if elapsed >= time.Duration(len(p.rates))*p.phase {
		return 0, true
	}
	if float64(hits) < p.expected(elapsed) {
		return 0, false
	}
	r := p.Rate(elapsed)
	if r <= 0 {
		return time.Duration(int(elapsed/p.phase)+1)*p.phase - elapsed, false
	}
	return time.Duration((float64(hits) + 1 - p.expected(elapsed)) / r * 1e9), false
}

func (p phasedPacer) Rate(elapsed time.Duration) float64 {
	i := int(elapsed / p.phase)
	if i < 0 || i >= len(p.rates) {
		return 0
	}
	return p.rates[i]
}

// RunReservation drives premium and free queries open-loop through the
// proxy in three phases and counts, per second and class, the units
// offered, admitted (not refused by sluice) and useful (answered in time).
func RunReservation(ctx context.Context, opts ReservationOptions) (*ReservationReport, error) {
	opts.defaults()
	_, p, stop, err := behindProxy(ctx, opts.Workers, opts.PolicyName, opts.Policy)
	if err != nil {
		return nil, err
	}
	defer stop()
	secs := 3 * int(opts.Phase/time.Second)
	premium := make([]ClassCounts, secs)
	free := make([]ClassCounts, secs)
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	send := func(path string, units float64, tenants int, pacer vegeta.Pacer, rows []ClassCounts) {
		defer wg.Done()
		atk := vegeta.NewAttacker(vegeta.Timeout(opts.Deadline), vegeta.KeepAlive(true), vegeta.Workers(64),
			vegeta.MaxWorkers(20000), vegeta.Connections(20000), vegeta.Redirects(vegeta.NoFollow))
		stop := context.AfterFunc(ctx, func() { atk.Stop() })
		defer stop()
		timeout := opts.Deadline.String()
		var seq atomic.Int64 // the targeter runs on the attacker's workers
		tgt := func(t *vegeta.Target) error {
			n := int(seq.Add(1))
			t.Method, t.URL = http.MethodGet, p.url+path+strconv.Itoa(n)
			t.Header = http.Header{"X-Api-Key": {"tenant-" + strconv.Itoa(n%tenants)}, "X-Request-Timeout": {timeout}}
			return nil
		}
		for r := range atk.Attack(tgt, pacer, time.Duration(secs)*time.Second, path) {
			i := int(r.Timestamp.Sub(start) / time.Second)
			if i < 0 || i >= secs {
				continue
			}
			mu.Lock()
			rows[i].Offered += units
			if r.Code == http.StatusOK || (r.Code == 0 && isTimeout(r.Error)) {
				rows[i].Admitted += units
			}
			if r.Code == http.StatusOK && r.Latency <= opts.Deadline {
				rows[i].Useful += units
			}
			mu.Unlock()
		}
	}
	wg.Add(2)
	go send("/premium/q/", 3, 20, phasedPacer{rates: opts.Premium[:], phase: opts.Phase}, premium)
	go send("/free/q/", 1, 100, vegeta.ConstantPacer{Freq: int(opts.Free), Per: time.Second}, free)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return reservationReport(&opts, premium, free), nil
}

// reservationReport sums the seconds into phases and states what the
// policy promises in each.
func reservationReport(opts *ReservationOptions, premium, free []ClassCounts) *ReservationReport {
	const capacity, recovery, reserve = 400.0, 4.0, 240.0
	rep := &ReservationReport{Policy: opts.PolicyName, Capacity: capacity, FirstSecondBack: premium[2*int(opts.Phase/time.Second)].Admitted}
	per := int(opts.Phase / time.Second)
	for ph := range 3 {
		var out ReservationPhase
		n := 0.0
		for i := ph*per + 1; i < (ph+1)*per; i++ {
			add(&out.Premium, premium[i])
			add(&out.Free, free[i])
			n++
		}
		scale(&out.Premium, 1/n)
		scale(&out.Free, 1/n)
		out.PremiumRPS = opts.Premium[ph]
		out.WantPremium = math.Min(3*opts.Premium[ph], reserve)
		out.WantFree = math.Min(opts.Free, capacity-recovery-out.WantPremium)
		out.Behind = out.Premium.Offered < 0.95*3*opts.Premium[ph] || out.Free.Offered < 0.95*opts.Free
		rep.Phases = append(rep.Phases, out)
	}
	return rep
}

func add(a *ClassCounts, b ClassCounts) {
	a.Offered += b.Offered
	a.Admitted += b.Admitted
	a.Useful += b.Useful
}

func scale(a *ClassCounts, f float64) {
	a.Offered *= f
	a.Admitted *= f
	a.Useful *= f
}

// WriteTable prints offered, admitted and useful units per class and
// phase against what the reservation promises.
func (r *ReservationReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "upstream: %.0f work units/s; units/s per class, the mean of each phase from its second second on\n\n", r.Capacity)
	fmt.Fprintf(w, "%-28s %8s %9s %7s %8s   %8s %9s %7s %8s\n", "phase", "premium", "admitted", "useful", "promised", "free", "admitted", "useful", "promised")
	names := []string{"both busy", "premium at %.0f queries/s", "premium back"}
	for i, ph := range r.Phases {
		name := names[i]
		if i == 1 {
			name = fmt.Sprintf(name, ph.PremiumRPS)
		}
		mark := ""
		if ph.Behind {
			mark = " (!)"
		}
		fmt.Fprintf(w, "%-28s %8.0f %9.0f %7.0f %8.0f   %8.0f %9.0f %7.0f %8.0f%s\n", name, ph.Premium.Offered, ph.Premium.Admitted,
			ph.Premium.Useful, ph.WantPremium, ph.Free.Offered, ph.Free.Admitted, ph.Free.Useful, ph.WantFree, mark)
	}
	fmt.Fprintf(w, "\npremium admitted in its first second back: %.0f units (reserve 240 units/s, revocation 500 ms)\n", r.FirstSecondBack)
	for _, ph := range r.Phases {
		if ph.Behind {
			fmt.Fprintln(w, "(!) the load generator delivered under 95% of the target rate in this phase: the machine is too busy")
			break
		}
	}
}

// WriteJSON writes the report as JSON to path.
func (r *ReservationReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
