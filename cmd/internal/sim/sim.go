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
			rep.Note = fmt.Sprintf("the policy's %s store is simulated in memory (one replica)", pol.Store.Backend)
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

// prepare builds a fresh engine: a virtual clock and, with a policy, a
// fresh chain of its gates on that clock.
func prepare(s *Scenario, f *policy.File, seed uint64) (*engine, error) {
	clk := &vclock{}
	var chain *sluice.Chain
	var rules identify.Rules
	if f != nil {
		// The probabilistic gates draw from their own seeded stream, so
		// the client and service streams stay the same in both runs.
		rg := rand.New(rand.NewPCG(seed, 0x67617465))
		rt, err := policy.Build(f, nil, policy.Options{Clock: clk, Virtual: true, Rand: rg.Float64})
		if err != nil {
			return nil, err
		}
		chain, rules = rt.Chain, rt.Rules
	}
	return newEngine(s, clk, chain, rules, seed)
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
	e.setLoad(s.Phases[0].Load)
	for i := 1; i < len(s.Phases); i++ {
		e.at(int64(s.Phases[i].At), evPhase, 0, int32(i))
	}
	var rows []Row
	for t := int64(0); t < int64(s.Length); t += int64(s.Interval) {
		end := min(t+int64(s.Interval), int64(s.Length))
		row := Row{T: time.Duration(t).Seconds(), Load: e.load}
		e.m, e.from, e.to = &row, t, end
		e.hist, e.busy, e.level = hist{}, 0, sluice.LevelNormal
		var waited0 int64
		if e.queuer != nil {
			_, _, waited0, _ = e.queuer.QueueStats(clock.Instant(t))
		}
		e.run(end)
		row.Queue = e.queue.size
		if f != nil {
			row.Level = e.level.String()
		}
		if e.sizer != nil {
			row.Limit, _ = e.sizer.ConcurrencyLimit()
		}
		if e.queuer != nil {
			_, _, waited, _ := e.queuer.QueueStats(clock.Instant(end))
			row.Waited = float64(waited-waited0) / time.Duration(end-t).Seconds()
		}
		row.finish(time.Duration(end-t).Seconds(), &e.hist, float64(e.busy), s.Workers)
		rows = append(rows, row)
	}
	return rows, nil
}
