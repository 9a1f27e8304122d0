package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/tracefile"
	"github.com/sluice-go/sluice/queue"
)

// fairDriver runs a fair queue in event mode over a spy gate: requests are
// named tenant#n in the order they arrive, and the trace prints who gets a
// slot when.
type fairDriver struct {
	clk     *fakeclock.Clock
	q       *queue.Queue
	park    *queue.Park
	names   []string // by tag
	reqs    []*sluice.Request
	running []uint64          // tags holding a slot, oldest first
	ids     map[uint64]uint64 // tag → the queue's id for it
	granted []string
	count   map[string]int
}

func (d *fairDriver) arrive(t *testing.T, cmd *tracefile.Cmd) string {
	tenant := cmd.Str("tenant", "a")
	var out []string
	for range cmd.Int(t, "n", 1) {
		d.count[tenant]++
		tag := uint64(len(d.names))
		name := fmt.Sprintf("%s#%d", tenant, d.count[tenant])
		r := &sluice.Request{Tenant: tenant, Cost: cmd.Int(t, "cost", 1)}
		d.names, d.reqs = append(d.names, name), append(d.reqs, r)
		d.park.Tag, d.park.Queue = tag, nil
		dec, p := gatetest.Decide(queue.ContextWithPark(context.Background(), d.park), d.q, r, d.clk.Now())
		switch {
		case !dec.Admitted:
			out = append(out, name+" refused "+dec.Reason.String())
		case d.park.Queue != nil:
			d.ids[tag] = d.park.ID
			out = append(out, name+" waits")
		default:
			d.ids[tag] = uint64(p)
			d.running = append(d.running, tag)
			out = append(out, name+" runs")
		}
	}
	return strings.Join(out, "\n")
}

// done ends the oldest n running requests and prints who gets their slots.
func (d *fairDriver) done(t *testing.T, cmd *tracefile.Cmd) string {
	d.granted = nil
	for range cmd.Int(t, "n", 1) {
		if len(d.running) == 0 {
			break
		}
		tag := d.running[0]
		d.running = d.running[1:]
		d.q.Release(d.reqs[tag], sluice.Permit(d.ids[tag]), sluice.Completion{Outcome: sluice.OutcomeUseful, Now: d.clk.Now(), Latency: time.Millisecond})
	}
	if len(d.granted) == 0 {
		return "no one waits"
	}
	return "next: " + strings.Join(d.granted, " ")
}

// The fair queue's dispatch order, step by step (testdata/fair.trace):
// weights, costs, a tenant back from idle, a closed-loop tenant beside a
// backlog, newcomers without standing.
func TestFairQueueTrace(t *testing.T) {
	var d *fairDriver
	tracefile.Run(t, "testdata/fair.trace", func(t *testing.T, cmd *tracefile.Cmd) string {
		switch cmd.Name {
		case "queue":
			clk := fakeclock.New(int64(time.Second))
			f := &queue.Fairness{Burst: cmd.Float(t, "burst", 0), Standing: cmd.Duration(t, "standing", 0)}
			if w := cmd.Str("weights", ""); w != "" {
				f.Weights = map[string]float64{}
				for _, kv := range strings.Split(w, ",") {
					k, v, _ := strings.Cut(kv, ":")
					var x float64
					fmt.Sscan(v, &x)
					f.Weights[k] = x
				}
			}
			inner := &spy{n: int(cmd.Int(t, "slots", 1))}
			q, err := queue.New("pool", inner, queue.Options{MaxWait: time.Hour, MaxLen: 1000, Clock: clk, Events: true, Fair: f})
			if err != nil {
				return err.Error()
			}
			d = &fairDriver{clk: clk, q: q, ids: map[uint64]uint64{}, count: map[string]int{}}
			d.park = &queue.Park{Ready: func(tag uint64, dec sluice.Decision) {
				if dec.Admitted {
					d.running = append(d.running, tag)
					d.granted = append(d.granted, d.names[tag])
				}
			}}
			return fmt.Sprintf("%d slots", inner.n)
		case "arrive":
			return d.arrive(t, cmd)
		case "done":
			return d.done(t, cmd)
		case "wait":
			d.clk.Advance(cmd.Duration(t, "for", 0))
			return "now " + time.Duration(d.clk.Now()).String()
		}
		t.Fatalf("%s: unknown command %s", cmd.Pos, cmd.Name)
		return ""
	})
}
