package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Incident is one entry of the incident library: a whole incident, not a
// step, on the routes-api model (the upstream of `sluice demo`: 8
// workers, reads, route solves and analytics, about 200 req/s; callers
// that wait 500 ms and send that budget), that a policy's protection must
// hold through from beginning to end.
type Incident struct {
	// Name identifies the incident (sluice sim --incidents lists them).
	Name string
	// Purpose says in one line what the incident tests.
	Purpose string
	// build returns the incident's scenario at full length, or at the
	// reduced length CI runs (quick: each long phase 4 minutes).
	build func(quick bool) Scenario
}

// Scenario returns the incident's scenario at full length, or at reduced
// length when quick.
func (in Incident) Scenario(quick bool) Scenario { return in.build(quick) }

// incidentBase is the routes-api model as the incidents run it: Poisson
// arrivals, callers that wait 500 ms and tell the service so.
func incidentBase(name, desc string) Scenario {
	s := RoutesAPI
	s.Name, s.Description = name, desc
	s.Loads, s.Reference, s.ReferenceName = nil, nil, ""
	s.Client = Client{Timeout: Const(500 * time.Millisecond), Attempts: 1, Arrivals: "poisson", Deadline: 500 * time.Millisecond}
	s.Interval = time.Second
	s.Policy = "routes-api"
	return s
}

// span is one phase of an incident before its start time is known: held
// for d (quick: min(d, 4 min), unless keep).
type span struct {
	d    time.Duration
	keep bool
	p    Phase
}

// phases lays the spans end to end and sets the scenario's length.
func phases(s *Scenario, quick bool, spans ...span) {
	var at time.Duration
	s.Phases = nil
	for _, sp := range spans {
		d := sp.d
		if quick && !sp.keep {
			d = min(d, 4*time.Minute)
		}
		p := sp.p
		p.At = at
		s.Phases = append(s.Phases, p)
		at += d
	}
	s.Length = at
}

// capacity of the routes-api model, req/s.
const routesCapacity = 200

// Incidents returns the incident library.
func Incidents() []Incident {
	c := float64(routesCapacity)
	return []Incident{
		{"sustained-3x", "three times capacity for an hour: the limit must not absorb a standing queue", func(q bool) Scenario {
			s := incidentBase("sustained-3x", "routes-api at 3x capacity for an hour")
			phases(&s, q, span{time.Hour, false, Phase{Load: 3 * c}})
			return s
		}},
		{"sustained-10x", "ten times capacity for an hour: the no stays cheap and goodput stays at capacity", func(q bool) Scenario {
			s := incidentBase("sustained-10x", "routes-api at 10x capacity for an hour")
			phases(&s, q, span{time.Hour, false, Phase{Load: 10 * c}})
			return s
		}},
		{"capacity-halved", "half the workers go away mid-incident at 3x, then come back: the limit follows both ways", func(q bool) Scenario {
			s := incidentBase("capacity-halved", "routes-api at 3x; 4 of its 8 workers gone for 20 minutes")
			phases(&s, q, span{10 * time.Minute, false, Phase{Load: 3 * c}}, span{20 * time.Minute, false, Phase{Load: 3 * c, Workers: 4}},
				span{10 * time.Minute, false, Phase{Load: 3 * c}})
			return s
		}},
		{"slow-dependency", "route solves' dependency 4x slower for 20 minutes at 80% load: a slower service is not a smaller one", func(q bool) Scenario {
			s := incidentBase("slow-dependency", "routes-api at 160 req/s; route solves 4x slower for 20 minutes")
			phases(&s, q, span{10 * time.Minute, false, Phase{Load: 0.8 * c}},
				span{20 * time.Minute, false, Phase{Load: 0.8 * c, Slowdown: 4, Classes: []string{"solve"}}},
				span{10 * time.Minute, false, Phase{Load: 0.8 * c}})
			return s
		}},
		{"retry-storm", "naive callers retry every refusal and timeout at once, 5 attempts, for an hour at 2x", func(q bool) Scenario {
			s := incidentBase("retry-storm", "routes-api at 2x for an hour; naive callers, 5 attempts, 10 ms backoff, no budget, Retry-After ignored")
			s.Client.Attempts, s.Client.Backoff, s.Client.IgnoreRetryAfter = 5, 10*time.Millisecond, true
			s.Client.Deadline = 0 // each attempt its own 500 ms, as a naive loop resends
			phases(&s, q, span{time.Hour, false, Phase{Load: 2 * c}})
			return s
		}},
		{"diurnal", "a day's ramp in an hour, 0.2x up to 3x and down: full admission below capacity, capacity above", func(q bool) Scenario {
			s := incidentBase("diurnal", "routes-api ramping 0.2x, 0.5x, 1x, 2x, 3x, 3x, 2x, 1x, 0.5x, 0.2x over an hour")
			var sp []span
			for _, m := range []float64{0.2, 0.5, 1, 2, 3, 3, 2, 1, 0.5, 0.2} {
				sp = append(sp, span{6 * time.Minute, false, Phase{Load: m * c}})
			}
			if q {
				for i := range sp {
					sp[i].d, sp[i].keep = 3*time.Minute, true
				}
			}
			phases(&s, false, sp...)
			return s
		}},
		{"flash-crowd", "20x for 60 s out of a quiet half-capacity: the limit holds, then admits everything again", func(q bool) Scenario {
			s := incidentBase("flash-crowd", "routes-api at 0.5x, 20x for 60 s, 0.5x")
			phases(&s, q, span{5 * time.Minute, false, Phase{Load: 0.5 * c}}, span{time.Minute, true, Phase{Load: 20 * c}},
				span{5 * time.Minute, false, Phase{Load: 0.5 * c}})
			return s
		}},
		{"partial-fleet", "one of three proxies loses its upstream for 20 minutes at 3x: the others' limits hold", func(q bool) Scenario {
			s := incidentBase("partial-fleet", "routes-api behind 3 proxies at 3x; proxy 3 cannot reach it for 20 minutes; callers retry 3 times")
			s.Processes = 3
			s.Client.Attempts, s.Client.Backoff = 3, 20*time.Millisecond
			phases(&s, q, span{10 * time.Minute, false, Phase{Load: 3 * c}}, span{20 * time.Minute, false, Phase{Load: 3 * c, Down: []int{3}}},
				span{10 * time.Minute, false, Phase{Load: 3 * c}})
			return s
		}},
	}
}

// IncidentBar is what every incident must keep: in each minute after the
// first two of a phase, goodput at least Goodput × min(offered,
// capacity) and late work at most Late × started; after an overload ends,
// full admission again within Recover.
var IncidentBar = struct {
	Goodput, Late float64
	Recover       time.Duration
	Settle        time.Duration
}{Goodput: 0.9, Late: 0.05, Recover: 30 * time.Second, Settle: 2 * time.Minute}

// IncidentResult is how a policy went through one incident.
type IncidentResult struct {
	Name    string `json:"name"`
	Purpose string `json:"purpose"`
	// Minutes are the judged minutes, in order.
	Minutes []IncidentMinute `json:"minutes"`
	// WorstGoodput is the lowest goodput ÷ min(offered, capacity) of a
	// judged minute, WorstLate the highest late ÷ started.
	WorstGoodput float64 `json:"worst_goodput"`
	WorstLate    float64 `json:"worst_late"`
	// Recoveries are, for each phase that ends an overload, the seconds
	// until admission was full again (-1: never within the phase).
	Recoveries []float64 `json:"recoveries,omitempty"`
	Pass       bool      `json:"pass"`
	// Failures say what failed.
	Failures []string `json:"failures,omitempty"`
	// Rows are the run's rows, a second each.
	Rows []Row `json:"-"`
}

// IncidentMinute is one judged minute of an incident.
type IncidentMinute struct {
	T        float64 `json:"t"` // its start, s
	Offered  float64 `json:"offered"`
	Capacity float64 `json:"capacity"`
	Goodput  float64 `json:"goodput"`
	Started  float64 `json:"started"`
	Late     float64 `json:"late"`
	Limit    int     `json:"limit,omitempty"`
}

// RunIncident runs one incident through pol and judges it.
func RunIncident(in Incident, pol *Policy, quick bool, seed uint64) (IncidentResult, error) {
	s := in.build(quick)
	rep, err := Simulate(s, Options{Policy: pol, Seed: seed, PolicyOnly: true})
	if err != nil {
		return IncidentResult{}, fmt.Errorf("incident %s: %w", in.Name, err)
	}
	s, err = s.withDefaults()
	if err != nil {
		return IncidentResult{}, err
	}
	res := IncidentResult{Name: in.Name, Purpose: in.Purpose, WorstGoodput: math.Inf(1), Rows: rep.Runs[0].Steps}
	judge(&res, &s)
	return res, nil
}

// judge fills in res's minutes, worst values, recoveries and verdict.
func judge(res *IncidentResult, s *Scenario) {
	rows := res.Rows
	sec := s.Interval.Seconds()
	overloaded := false
	for i, p := range s.Phases {
		end := s.Length
		if i+1 < len(s.Phases) {
			end = s.Phases[i+1].At
		}
		capa := phaseCapacity(s, &s.Phases[i])
		for t := p.At + IncidentBar.Settle; t+time.Minute <= end; t += time.Minute {
			m := IncidentMinute{T: t.Seconds(), Capacity: capa}
			from, to := int(t.Seconds()/sec), int((t+time.Minute).Seconds()/sec)
			for _, r := range rows[from:min(to, len(rows))] {
				m.Offered += r.Offered * sec / 60
				m.Goodput += r.Goodput * sec / 60
				m.Started += r.Started * sec / 60
				m.Late += r.Late * sec / 60
				m.Limit = r.Limit
			}
			res.Minutes = append(res.Minutes, m)
			want := min(m.Offered, capa)
			if g := m.Goodput / want; want > 0 {
				res.WorstGoodput = min(res.WorstGoodput, g)
				if g < IncidentBar.Goodput {
					res.Failures = append(res.Failures, fmt.Sprintf("minute at %s: goodput %.0f of %.0f (%.0f%%)", t, m.Goodput, want, 100*g))
				}
			}
			if l := m.Late / max(m.Started, 1); l > res.WorstLate {
				res.WorstLate = l
				if l > IncidentBar.Late {
					res.Failures = append(res.Failures, fmt.Sprintf("minute at %s: %.1f%% of started work late", t, 100*l))
				}
			}
		}
		// An overload ends with the first phase below 90% of capacity
		// (at capacity itself a queue comes and goes, and some requests
		// cannot start in time whatever admits them).
		switch {
		case p.Load > capa:
			overloaded = true
		case overloaded && p.Load <= 0.9*capa:
			overloaded = false
			r := recovery(rows, int(p.At.Seconds()/sec), int(end.Seconds()/sec), sec)
			res.Recoveries = append(res.Recoveries, r)
			if r < 0 || r > IncidentBar.Recover.Seconds() {
				res.Failures = append(res.Failures, fmt.Sprintf("after the overload ending at %s: admission full again after %s", p.At, recoveryText(r)))
			}
		}
	}
	if math.IsInf(res.WorstGoodput, 1) {
		res.WorstGoodput = 0
	}
	res.Pass = len(res.Failures) == 0
}

// recovery returns the seconds from row from until admission is full
// again: the first row from which 10 s of rows refuse no more than 2% of
// their attempts (bar one request); -1 if none does before row to.
func recovery(rows []Row, from, to int, sec float64) float64 {
	span := max(int(10/sec), 1)
	for i := from; i+span <= min(to, len(rows)); i++ {
		var refused, attempts float64
		for _, r := range rows[i : i+span] {
			for _, v := range r.Rejected {
				refused += v * sec
			}
			attempts += r.Attempts * sec
		}
		if refused <= 0.02*attempts+1 {
			return float64(i-from) * sec
		}
	}
	return -1
}

func recoveryText(r float64) string {
	if r < 0 {
		return "never"
	}
	return fmt.Sprintf("%.0f s", r)
}

// phaseCapacity returns the worker pool's capacity in phase p, in units/s,
// for the phase's mix of work: its workers divided by the mean worker time
// per unit, slowdown included.
func phaseCapacity(s *Scenario, p *Phase) float64 {
	workers := float64(s.Workers)
	if p.Workers > 0 {
		workers = float64(p.Workers)
	}
	var shares, perUnit float64
	for _, c := range s.Classes {
		share := c.Share
		if len(p.Shares) > 0 {
			share = p.Shares[c.Name]
		}
		slow := 1.0
		if p.Slowdown > 0 && (len(p.Classes) == 0 || contains(p.Classes, c.Name)) {
			slow = p.Slowdown
		}
		shares += share
		perUnit += share / float64(c.Units) * c.Service.mean() * slow
	}
	if perUnit == 0 {
		return 0
	}
	return workers * shares / perUnit
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// WriteIncidents writes the pass/fail table of results.
func WriteIncidents(w io.Writer, policy string, quick bool, results []IncidentResult) {
	length := "full length"
	if quick {
		length = "reduced length (long phases 4 minutes)"
	}
	fmt.Fprintf(w, "incident library, %s, policy %s\n", length, policy)
	fmt.Fprintf(w, "bar: every minute after the first %v of a phase, goodput >= %.0f%% of min(offered, capacity) and late <= %.0f%% of started work; full admission within %v of an overload's end (the first phase below 90%% of capacity after one above it)\n\n",
		IncidentBar.Settle, 100*IncidentBar.Goodput, 100*IncidentBar.Late, IncidentBar.Recover)
	fmt.Fprintf(w, "%-16s %8s %14s %10s %12s  %s\n", "incident", "minutes", "worst goodput", "worst late", "recovery s", "result")
	for _, r := range results {
		rec := "-"
		if len(r.Recoveries) > 0 {
			parts := make([]string, len(r.Recoveries))
			for i, x := range r.Recoveries {
				parts[i] = recoveryText(x)
			}
			rec = strings.ReplaceAll(strings.Join(parts, ","), " s", "")
		}
		verdict := "PASS"
		if !r.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%-16s %8d %13.1f%% %9.2f%% %12s  %s\n", r.Name, len(r.Minutes), 100*r.WorstGoodput, 100*r.WorstLate, rec, verdict)
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "%s: %s\n", r.Name, r.Purpose)
		for _, f := range r.Failures {
			fmt.Fprintf(w, "  FAIL %s\n", f)
		}
	}
	fmt.Fprintln(w)
}
