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
}

// queueField reads the queue mapping of a concurrency kind.
func queueField(q *queueSettings) field {
	return field{key: "queue", doc: "a bounded wait queue in front of the limit (in-process, service scope): {max_wait: 100ms, " +
		"max_len: 1000, classes: [highest first]}; a request waits for a slot only while it can still start in time",
		def: "none (reject at once)",
		parse: func(p *parser, v *yaml.Node, path string) {
			q.set = true
			p.Fields(v, path, []string{"max_wait", "max_len", "classes"}, func(k string, vv *yaml.Node) {
				at := yamlfile.Join(path, k)
				switch k {
				case "max_wait":
					q.maxWait = p.Duration(vv, at, time.Millisecond)
				case "max_len":
					q.maxLen = p.Integer(vv, at, 1, 1<<20)
				case "classes":
					q.classes = p.classList(vv, at)
				}
			})
		}}
}

// check validates the queue against the gate's scope and the backend.
func (q *queueSettings) check(c *checker) {
	if !q.set {
		return
	}
	switch {
	case c.g.Scope != sluice.ScopeService:
		c.failf("queue", "a wait queue protects the whole service: it needs scope service, not %s", c.g.Scope)
	case c.redis():
		c.failf("queue", "a wait queue is woken by this process's releases; on redis a fleet limit's slots free elsewhere too")
	}
	for j, class := range q.classes {
		if !validClass(c, class) {
			c.failf("queue", "classes[%d]: unknown class %q (classes the routes assign: %s)", j, class, strings.Join(c.classes, ", "))
		}
	}
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
		Clock: b.opts.Clock, Events: b.opts.Virtual})
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
	return fmt.Sprintf(", waiting up to %v for a slot", wait)
}
