package policy

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/limit"
)

// leaseSettings are a service-wide rate gate's lease of a fleet budget
// (package lease): lease: {time: 10s, refresh: 2500ms, on_failure: safe,
// safe_share: 0}.
type leaseSettings struct {
	set       bool
	time      time.Duration
	refresh   time.Duration
	onFailure string
	safeShare int64
}

var leaseFailures = map[string]lease.Failure{"safe": lease.FailSafe, "open": lease.FailOpen, "closed": lease.FailClosed}

func leaseField(l *leaseSettings) field {
	return field{key: "lease", typ: "mapping {time, refresh, on_failure, safe_share}", doc: "spend a lease of the fleet-wide budget in process instead of one Redis call per decision " +
		"(package lease): {time: 10s, refresh: lease/4, on_failure: safe|open|closed, safe_share: units/s or slots}; the " +
		"processes share the budget max-min by their demand; scope service (a rate: a whole number of units per second)",
		def: "none (one decision per request on the store)",
		parse: func(p *parser, v *yaml.Node, path string) {
			l.set = true
			p.Fields(v, path, []string{"time", "refresh", "on_failure", "safe_share"}, func(k string, vv *yaml.Node) {
				at := yamlfile.Join(path, k)
				switch k {
				case "time":
					l.time = p.Duration(vv, at, 10*time.Millisecond)
				case "refresh":
					l.refresh = p.Duration(vv, at, time.Millisecond)
				case "on_failure":
					l.onFailure = p.OneOf(vv, at, "safe", "open", "closed")
				case "safe_share":
					l.safeShare = p.Integer(vv, at, 1, lease.MaxGateRate)
				}
			})
		}}
}

// allocator is the lease's budget for a rate: its units per second, the
// lease time and refresh.
func (l *leaseSettings) allocator(rate limit.Rate) (lease.Allocator, error) {
	per := rate.Per()
	if per <= 0 || (rate.Tokens()*int64(time.Second))%int64(per) != 0 {
		return lease.Allocator{}, fmt.Errorf("a lease divides a whole number of units per second; %s is not one", rate)
	}
	a, err := l.slots(rate.Tokens() * int64(time.Second) / int64(per))
	if err == nil && a.Capacity > lease.MaxGateRate {
		err = fmt.Errorf("a lease divides at most %d units/s", int64(lease.MaxGateRate))
	}
	return a, err
}

// slots is the lease's budget of capacity units (a concurrency budget's
// slots, a rate's units per second).
func (l *leaseSettings) slots(capacity int64) (lease.Allocator, error) {
	a := lease.Allocator{Capacity: capacity, Lease: l.time, Refresh: l.refresh}
	if a.Lease == 0 {
		a.Lease = 10 * time.Second
	}
	return a, a.Validate()
}

// scoped reports a lease on a gate that is not service-wide.
func (l *leaseSettings) scoped(c *checker) bool {
	if c.g.Scope != sluice.ScopeService {
		c.failf("lease", "a lease divides one fleet-wide budget: it needs scope service, not %s", c.g.Scope)
		return false
	}
	return true
}

func (l *leaseSettings) check(c *checker, rate limit.Rate, burst int64) {
	if !l.set || !l.scoped(c) {
		return
	}
	a, err := l.allocator(rate)
	if err != nil {
		c.failf("lease", "%v", err)
		return
	}
	if b := time.Duration(float64(burst) / float64(a.Capacity) * float64(time.Second)); b < time.Millisecond || b > time.Second {
		c.failf("lease", "burst %d is %v at %d units/s; a lease's local bucket holds 1ms to 1s of its grant", burst, b, a.Capacity)
	}
}

// checkSlots validates a concurrency budget's lease.
func (l *leaseSettings) checkSlots(c *checker, limit int64) {
	if !l.set || !l.scoped(c) {
		return
	}
	if _, err := l.slots(limit); err != nil {
		c.failf("lease", "%v", err)
	}
}

// clientID names this process among the fleet's lease holders: host,
// process id and a random suffix (a restarted process is a new client).
var clientID = func() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}()

// build returns the lease gate of a rate gate named by b, spending
// rate·burst, and registers its refresh loop with the runtime.
func (l *leaseSettings) build(b *builder, rate limit.Rate, burst int64) (sluice.Gate, error) {
	a, err := l.allocator(rate)
	if err != nil {
		return nil, err
	}
	o := l.options(b, a)
	o.Burst = time.Duration(float64(burst) / float64(a.Capacity) * float64(time.Second))
	g, err := lease.NewGate(b.g.Name, o)
	if err != nil {
		return nil, err
	}
	if !o.Inline {
		b.run = g.Run
		if old, ok := sluice.As[*lease.Gate](b.prevGate); ok {
			b.handover = func() { g.Continue(old) }
		}
	}
	return g, nil
}

// buildSlots returns the lease gate of a concurrency budget of limit
// slots, and registers its refresh loop with the runtime.
func (l *leaseSettings) buildSlots(b *builder, limit int64, weighted bool) (*lease.Concurrency, error) {
	a, err := l.slots(limit)
	if err != nil {
		return nil, err
	}
	o := l.options(b, a)
	o.Weighted, o.RetryHint = weighted, b.g.RetryHint
	g, err := lease.NewConcurrency(b.g.Name, o)
	if err != nil {
		return nil, err
	}
	if !o.Inline {
		b.run = g.Run
		if old, ok := sluice.As[*lease.Concurrency](b.prevGate); ok {
			b.handover = func() { g.Continue(old) }
		}
	}
	return g, nil
}

// options are a lease gate's options for a. On the memory backend the
// budget is this process's alone, with the runtime's in-process allocator
// (kept across reloads);
// Options.Leaser shares one between runtimes (the simulator's processes),
// and on a virtual clock the gate refreshes as it decides.
func (l *leaseSettings) options(b *builder, a lease.Allocator) lease.GateOptions {
	var leaser lease.Leaser = b.local
	switch {
	case b.opts.Leaser != nil:
		leaser = b.opts.Leaser
	case b.redis != nil:
		leaser = b.redis
	}
	client := b.opts.LeaseClient
	if client == "" {
		client = clientID
	}
	return lease.GateOptions{Budget: b.g.Name, Client: client, Allocator: a, Leaser: leaser,
		OnFailure: leaseFailures[l.onFailure], SafeShare: l.safeShare, Clock: b.opts.Clock,
		Inline: b.opts.Virtual && (b.opts.Leaser != nil || b.redis == nil)} // no loop follows a virtual clock
}

// describe is the lease's part of a rate gate's spec line.
func (l *leaseSettings) describe(rate limit.Rate) string {
	if !l.set {
		return ""
	}
	a, err := l.allocator(rate)
	if err != nil {
		return ""
	}
	return l.describeFor(a, fmt.Sprintf("of the fleet's %d units/s", a.Capacity),
		fmt.Sprintf("the fleet admits at most %d·(T + burst) in any T", a.Capacity))
}

// describeSlots is the lease's part of a concurrency gate's spec line.
func (l *leaseSettings) describeSlots(limit int64) string {
	if !l.set {
		return ""
	}
	a, err := l.slots(limit)
	if err != nil {
		return ""
	}
	return l.describeFor(a, fmt.Sprintf("of the fleet's %d slots", limit),
		fmt.Sprintf("the fleet has at most %d in flight while its processes reach the allocator", limit))
}

func (l *leaseSettings) describeFor(a lease.Allocator, budget, bound string) string {
	refresh := a.Refresh
	if refresh == 0 {
		refresh = a.Lease / 4
	}
	mode := l.onFailure
	if mode == "" {
		mode = "safe"
	}
	return fmt.Sprintf(", spent from a lease (%v, refreshed every %v) %s, shared max-min by demand; "+
		"the grants never sum above it, so %s; after an allocator restart it confirms holdings for %v "+
		"and grants nothing new (processes holding nothing spend safe shares of the rest); without a lease: %s",
		a.Lease, refresh, budget, bound, a.Lease, mode)
}
