package sim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/policy"
)

// Policy is a policy file's content and the name it is reported under.
type Policy struct {
	Name string
	Data []byte
}

// Options configures Simulate.
type Options struct {
	// Policy decides admission in the second run; nil: only the run
	// without admission.
	Policy *Policy
	// Seed overrides the scenario's seed when not 0.
	Seed uint64
	// Progress receives one line per finished run (nil: none).
	Progress io.Writer
	// PolicyOnly skips the run without admission (with a Policy).
	PolicyOnly bool
}

// NoAdmission names the run without any admission control.
const NoAdmission = "no admission"

// Simulate runs s once without admission and once through the policy: a
// sweep of s.Loads (a row per load) or, when s.Phases is set, a time
// series (a row per s.Interval). The same seed gives the same report bit
// for bit; the two runs of a step share their random streams, so they see
// the same arrivals. Errors name the scenario or policy field at fault.
func Simulate(s Scenario, opts Options) (*Report, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.Seed != 0 {
		s.Seed = opts.Seed
	}
	rep := &Report{Scenario: s.Name, Unit: s.Unit, Capacity: math.Round(s.ModeledCapacity()*1e6) / 1e6, Workers: s.Workers, Seed: s.Seed, Series: len(s.Phases) > 0}
	if s.Processes > 1 {
		rep.Processes = s.Processes
	}
	if !rep.Series {
		rep.StepSeconds = s.Step.Seconds()
		rep.Reference, rep.ReferenceName = s.Reference, s.ReferenceName
	}
	var pol *policy.File
	if opts.Policy != nil {
		pol, err = policy.Parse(opts.Policy.Name, opts.Policy.Data)
		if err != nil {
			return nil, err
		}
		if pol.Store.Backend != policy.BackendMemory {
			rep.Note = storeNote(pol.Store.Backend, s.Processes)
			pol.Store.Backend = policy.BackendMemory
		}
		rep.Policy = opts.Policy.Name
		if e, err := prepare(&s, pol, s.Seed); err == nil && len(e.unmatched) > 0 {
			note := fmt.Sprintf("no route of %s matches scenario class %s: it runs as class %s at cost 1",
				opts.Policy.Name, strings.Join(e.unmatched, ", "), sluice.ClassDefault)
			if rep.Note != "" {
				note = rep.Note + "; " + note
			}
			rep.Note = note
		}
	}
	runs := []*policy.File{nil}
	if pol != nil {
		runs = append(runs, pol)
		if opts.PolicyOnly {
			runs = runs[1:]
		}
	}
	for _, f := range runs {
		run := Run{Name: NoAdmission}
		if f != nil {
			run.Name = "sluice (" + opts.Policy.Name + ")"
		}
		if rep.Series {
			rows, err := series(&s, f, s.Seed)
			if err != nil {
				return nil, err
			}
			run.Steps = rows
		} else {
			for i, load := range s.Loads {
				row, err := step(&s, f, load, s.Seed+uint64(i)*0x9e3779b97f4a7c15)
				if err != nil {
					return nil, err
				}
				run.Steps = append(run.Steps, row)
			}
		}
		rep.Runs = append(rep.Runs, run)
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "sim: %s: %s done\n", s.Name, run.Name)
		}
	}
	return rep, nil
}

// storeNote says how the simulator runs a policy's shared store.
func storeNote(backend string, processes int) string {
	if processes > 1 {
		return fmt.Sprintf("the policy's %s store is simulated in memory, one per process: "+
			"only gates with a lease share their budget between the %d processes", backend, processes)
	}
	return fmt.Sprintf("the policy's %s store is simulated in memory (one replica)", backend)
}

// prepare builds a fresh engine: a virtual clock and, with a policy, a
// fresh chain of its gates on that clock for each process. The processes'
// lease gates share one allocator on the same clock; their other gates
// are each process's own.
func prepare(s *Scenario, f *policy.File, seed uint64) (*engine, error) {
	clk := &vclock{}
	chains := make([]*sluice.Chain, s.Processes)
	var rules identify.Rules
	if f != nil {
		leaser := &lease.Local{Clock: clk}
		for p := range chains {
			// The probabilistic gates draw from their own seeded stream
			// per process, so the client and service streams stay the
			// same in both runs (the first process's is the stream of a
			// run with one).
			rg := rand.New(rand.NewPCG(seed, 0x67617465+uint64(p)<<32))
			rt, err := policy.Build(f, nil, policy.Options{Clock: clk, Virtual: true, Rand: rg.Float64,
				Leaser: leaser, LeaseClient: processName(p)})
			if err != nil {
				return nil, err
			}
			chains[p], rules = rt.Chain, rt.Rules
		}
	}
	return newEngine(s, clk, chains, rules, seed)
}

// step runs one sweep step at load.
func step(s *Scenario, f *policy.File, load float64, seed uint64) (Row, error) {
	e, err := prepare(s, f, seed)
	if err != nil {
		return Row{}, err
	}
	row := Row{Load: load}
	e.m, e.from, e.to = &row, int64(s.Warmup), int64(s.Step)
	e.setLoad(load)
	e.run(int64(s.Step))
	if e.full {
		return Row{}, e.errFull()
	}
	e.leases(int64(s.Step))
	row.finish((s.Step - s.Warmup).Seconds(), &e.hist, float64(e.busy), s.Workers)
	return row, nil
}

// series runs the time series of s.Phases.
func series(s *Scenario, f *policy.File, seed uint64) ([]Row, error) {
	e, err := prepare(s, f, seed)
	if err != nil {
		return nil, err
	}
	e.setSlowdown(&s.Phases[0])
	e.setShares(&s.Phases[0])
	if len(s.Phases[0].Balance) > 0 {
		e.setBalance(s.Phases[0].Balance)
	}
	e.setLoad(s.Phases[0].Load)
	e.setPool(&s.Phases[0])
	for i := 1; i < len(s.Phases); i++ {
		e.at(int64(s.Phases[i].At), evPhase, 0, int32(i))
	}
	var rows []Row
	for t := int64(0); t < int64(s.Length); t += int64(s.Interval) {
		end := min(t+int64(s.Interval), int64(s.Length))
		row := Row{T: time.Duration(t).Seconds(), Load: e.load}
		e.m, e.from, e.to = &row, t, end
		e.hist, e.busy, e.level = hist{}, 0, sluice.LevelNormal
		waited0, _ := e.waited(t)
		e.run(end)
		if e.full {
			return nil, e.errFull()
		}
		row.Queue = e.queue.size
		if f != nil {
			row.Level = e.level.String()
		}
		// With several processes, the limit and the waits are the fleet's:
		// the sums over the processes' gates.
		for _, p := range e.procs {
			if p.sizer != nil {
				l, _ := p.sizer.ConcurrencyLimit()
				row.Limit += l
			}
		}
		if waited, ok := e.waited(end); ok {
			row.Waited = float64(waited-waited0) / time.Duration(end-t).Seconds()
		}
		e.leases(end)
		row.finish(time.Duration(end-t).Seconds(), &e.hist, float64(e.busy), e.workers)
		rows = append(rows, row)
	}
	return rows, nil
}

// waited sums the requests that waited in the processes' first wait
// queues up to t; false when no process has one.
func (e *engine) waited(t int64) (n int64, ok bool) {
	for _, p := range e.procs {
		if p.queuer != nil {
			_, _, w, _ := p.queuer.QueueStats(clock.Instant(t))
			n, ok = n+w, true
		}
	}
	return n, ok
}

// leases records, with several processes, each process's live lease at t
// in the current row.
func (e *engine) leases(t int64) {
	if len(e.procs) < 2 {
		return
	}
	e.procRows()
	for i, p := range e.procs {
		if p.lease == nil {
			continue
		}
		if st := p.lease.Lease(clock.Instant(t)); st.Live {
			e.m.Processes[i].Lease, e.m.Processes[i].LeaseLive = st.Granted, true
		}
	}
}
