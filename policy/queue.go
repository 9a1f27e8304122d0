package policy

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/queue"
)

// queueSettings are the wait queue (package queue) a service-wide
// concurrency kind may put in front of its gate: the field
// queue: {max_wait: 100ms, max_len: 1000, classes: [critical, default]}.
type queueSettings struct {
	set     bool
	maxWait time.Duration
	maxLen  int64
	classes []string
	fair    *queue.Fairness
	pct     float64 // the start-in-time test's percentile of service times (0: the queue's default)
}

// queueField reads the queue mapping of a concurrency kind.
func queueField(q *queueSettings) field {
	return field{key: "queue", typ: "mapping {max_wait, max_len, classes, fair, percentile}", doc: "a bounded wait queue in front of the limit (in-process, service scope): {max_wait: 100ms, " +
		"max_len: 1000, classes: [highest first], fair: {weights: {tenant: weight}, default: 1, burst: 0, standing: 1m}, percentile: 90%}; a request waits for a " +
		"slot only while it can still start in time: while its deadline leaves it the percentile (default 90%) of its class's recent service times (a deadline gate's estimates when the policy has one); with fair, each class's waiters are served between tenants in weighted " +
		"fair shares of work units (start-time fair queueing); with fair.standing, a tenant first seen less than that ago waits in one flow shared by all such " +
		"tenants, so a thousand fresh keys take one tenant's share",
		def: "none (reject at once)",
		parse: func(p *parser, v *yaml.Node, path string) {
			q.set = true
			p.Fields(v, path, []string{"max_wait", "max_len", "classes", "fair", "percentile"}, func(k string, vv *yaml.Node) {
				at := yamlfile.Join(path, k)
				switch k {
				case "max_wait":
					if q.maxWait = p.Duration(vv, at, time.Millisecond); q.maxWait > 24*time.Hour {
						p.Errf(vv, at, "%v: at most 24h (a wait queue holds requests, not jobs)", q.maxWait)
					}
				case "max_len":
					q.maxLen = p.Integer(vv, at, 1, 1<<20)
				case "classes":
					q.classes = p.classList(vv, at)
				case "fair":
					q.fair = p.fairness(vv, at)
				case "percentile":
					n := len(p.Errs)
					if q.pct = p.share(vv, at); len(p.Errs) == n && (q.pct < 0.5 || q.pct > 1) { // 0 written is no percentile, not the default
						p.Errf(vv, at, "%v: want a percentile from 50%% to 100%%", vv.Value)
					}
				}
			})
		}}
}

// fairness reads {weights: {tenant: weight}, default: 1, burst: 0, standing: 0}.
func (p *parser) fairness(v *yaml.Node, path string) *queue.Fairness {
	f := &queue.Fairness{}
	p.Fields(v, path, []string{"weights", "default", "burst", "standing"}, func(k string, vv *yaml.Node) {
		at := yamlfile.Join(path, k)
		switch k {
		case "weights":
			if vv.Kind != yaml.MappingNode {
				p.Errf(vv, at, "want a mapping of tenant to weight, e.g. {acme: 2}")
				return
			}
			f.Weights = map[string]float64{}
			for i := 0; i+1 < len(vv.Content); i += 2 {
				k := vv.Content[i]
				t := k.Value
				switch {
				case k.Kind != yaml.ScalarNode || t == "":
					p.Errf(k, at, "a tenant is a non-empty scalar, got %s", yamlfile.KindName(k))
					continue
				case f.Weights[t] != 0:
					p.Errf(k, yamlfile.Join(at, t), "duplicate tenant")
					continue
				}
				f.Weights[t] = p.Float(vv.Content[i+1], yamlfile.Join(at, t), queue.MinWeight, queue.MaxWeight)
			}
		case "default":
			f.Default = p.Float(vv, at, queue.MinWeight, queue.MaxWeight)
		case "burst":
			f.Burst = p.Float(vv, at, 0, queue.MaxBurst)
		case "standing":
			if f.Standing = p.Duration(vv, at, time.Second); f.Standing > queue.MaxStanding {
				p.Errf(vv, at, "%v: at most %v", f.Standing, queue.MaxStanding)
			}
		}
	})
	return f
}

// check validates the queue against the gate's scope and the backend;
// leased says the slots are this process's lease of a fleet budget, freed
// by its own releases.
func (q *queueSettings) check(c *checker, leased bool) {
	if !q.set {
		return
	}
	switch {
	case c.g.Scope != sluice.ScopeService:
		c.failf("queue", "a wait queue protects the whole service: it needs scope service, not %s", c.g.Scope)
	case c.redis() && !leased:
		c.failf("queue", "a wait queue is woken by this process's releases; on redis a fleet limit's slots free elsewhere too "+
			"(a lease: makes them this process's)")
	}
	for j, class := range q.classes {
		if !validClass(c, class) {
			c.failf("queue", "classes[%d]: unknown class %q (classes the routes assign: %s)", j, class, strings.Join(c.classes, ", "))
		}
	}
	c.servedFirst("queue.classes", q.classes)
}

func validClass(c *checker, class string) bool {
	for _, k := range c.classes {
		if k == class {
			return true
		}
	}
	return false
}

// wrap puts the queue in front of g.
func (q *queueSettings) wrap(b *builder, g sluice.Gate) (sluice.Gate, error) {
	if !q.set {
		return g, nil
	}
	return queue.New(b.g.Name, g, queue.Options{MaxWait: q.maxWait, MaxLen: int(q.maxLen), Classes: q.classes,
		Clock: b.opts.Clock, Events: b.opts.Virtual, Fair: q.fair, Percentile: q.pct})
}

// describe is the queue's part of the spec line.
func (q *queueSettings) describe() string {
	if !q.set {
		return ""
	}
	wait := q.maxWait
	if wait == 0 {
		wait = 100 * time.Millisecond
	}
	order := ""
	if len(q.classes) > 0 {
		order = ", class queues served in the order " + strings.Join(q.classes, " > ") + " > others"
	}
	fair := ""
	if q.fair != nil {
		fair = fmt.Sprintf(", each class's tenants served in weighted fair shares of work units (weights set for %d tenants, others 1; burst %v)",
			len(q.fair.Weights), q.fair.Burst)
		if q.fair.Standing > 0 {
			fair += fmt.Sprintf(", tenants first seen less than %v ago sharing one flow", q.fair.Standing)
		}
	}
	return fmt.Sprintf(", waiting up to %v for a slot%s%s", wait, order, fair)
}
