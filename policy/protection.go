package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/shed"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func (g *Gate) controllerConfig() shed.ControllerConfig {
	return shed.ControllerConfig{Good: g.Good, Bad: g.Bad, Delay: g.Delay, ShedAllAfter: g.ShedAllAfter}
}

func (g *Gate) ladderConfig() shed.LadderConfig {
	return shed.LadderConfig{
		DegradeEnter: g.DegradeEnter, DegradeExit: g.DegradeExit, ShedEnter: g.ShedEnter, ShedExit: g.ShedExit,
		MinDwell: g.MinDwell, RecoverSteps: g.RecoverSteps, StepEvery: g.StepEvery, SampleEvery: g.SampleEvery,
		Protected: g.Protected, Workers: g.Workers, RetryHint: g.RetryHint,
	}
}

// checkProtection validates a protection gate's settings against each
// other and against the classes the routes assign.
func (p *parser) checkProtection(i int, g *Gate, classes []string) {
	if !protectionKinds[g.Kind] {
		return
	}
	path := fmt.Sprintf("gates[%d]", i)
	fail := func(field, format string, args ...any) {
		line := g.Line
		if l, ok := g.fields[field]; ok {
			line = l
		}
		p.Errs = append(p.Errs, &Error{File: p.File, Line: line, Field: yamlfile.Join(path, field), Msg: fmt.Sprintf(format, args...)})
	}
	unknown := func(field string, names []string) {
		for j, c := range names {
			if c != "" && !slices.Contains(classes, c) {
				fail(field, "%s[%d]: unknown tier or class %q (classes the routes assign: %s)", field, j, c, strings.Join(classes, ", "))
			}
		}
	}
	if _, ok := g.fields["scope"]; ok {
		fail("scope", "does not apply to kind %s (it protects the whole service)", g.Kind)
	}
	switch g.Kind {
	case KindFleetUsage:
		if _, err := gate.FleetUsageLimit(g.Limit, g.Reserve); err != nil && g.Limit > 0 {
			fail("reserve", "%s", strings.TrimPrefix(err.Error(), "fleet usage: "))
		}
		var reserved []string
		for c := range g.Reserve {
			reserved = append(reserved, c)
		}
		slices.Sort(reserved)
		unknown("reserve", reserved)
	case KindUtilization:
		if err := g.controllerConfig().Validate(); err != nil {
			field := "good"
			if g.Delay < 0 {
				field = "delay"
			}
			fail(field, "%v", err)
		}
		if g.Source != "cpu" && g.Workers < 1 {
			fail("workers", "missing: the own accounting needs workers (or set source: cpu)")
		}
		unknown("tiers", g.Tiers)
	case KindLadder:
		if err := g.ladderConfig().Validate(); err != nil {
			fail("degrade", "%s", strings.TrimPrefix(err.Error(), "ladder: "))
		}
		unknown("protected", g.Protected)
	}
}

// buildProtection builds a fleet_usage, utilization or ladder gate.
func (g *Gate) buildProtection(st Store, prev *builtGate, rc *redisConn, rnd func() float64) (sluice.Gate, func(any) store.Limiter, error) {
	switch g.Kind {
	case KindFleetUsage:
		n, err := gate.FleetUsageLimit(g.Limit, g.Reserve)
		if err != nil {
			return nil, nil, err
		}
		c, err := limit.NewConcurrency(n)
		if err != nil {
			return nil, nil, err
		}
		var lim store.Limiter
		var rebind func(any) store.Limiter
		opts := gate.Options{OnFailure: g.failure(), RetryHint: g.RetryHint}
		switch {
		case rc != nil:
			ttl := g.TTL
			if ttl == 0 {
				ttl = time.Minute
			}
			if lim, err = rc.st.Concurrency(g.Name, c, ttl); err != nil {
				return nil, nil, err
			}
			if opts.OnFailure == gate.LocalFallback {
				fb, _ := limit.NewConcurrency(max(n/max(st.Replicas, 1), 1))
				opts.Fallback = memory.NewKeyed(fb, memory.Options{})
			}
		case prev != nil && prev.rebind != nil:
			lim, rebind = prev.rebind(c), prev.rebind
		default:
			lim, rebind = newKeyed(c, memory.Options{MaxKeys: st.MaxKeys})
		}
		reserved := make([]string, 0, len(g.Reserve))
		for class := range g.Reserve {
			reserved = append(reserved, class)
		}
		slices.Sort(reserved)
		fu, err := gate.NewFleetUsage(g.Name, lim, reserved, opts)
		return fu, rebind, err
	case KindUtilization:
		ctrl, err := shed.NewController(g.controllerConfig())
		if err != nil {
			return nil, nil, err
		}
		opts := shed.UtilizationOptions{Tiers: g.Tiers, Workers: g.Workers, SampleEvery: g.SampleEvery,
			CostAware: g.CostAware, RetryHint: g.RetryHint, Rand: rnd}
		if g.Source == "cpu" {
			opts.Source = shed.NewCPUSource()
		}
		u, err := shed.NewUtilization(g.Name, ctrl, opts)
		return u, nil, err
	case KindLadder:
		cfg := g.ladderConfig()
		cfg.Rand = rnd
		l, err := shed.NewLadder(g.Name, cfg)
		return l, nil, err
	}
	return nil, nil, fmt.Errorf("kind %s is not a protection gate", g.Kind)
}
