package policy_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/policy"
)

// bubbleClock reads synctest's fake time (clock.System is relative to the
// process's start, before the bubble's epoch, so its instants are negative
// in a bubble and a request's deadline would be invalid).
type bubbleClock struct{ start time.Time }

func (c bubbleClock) Now() clock.Instant { return clock.Instant(time.Since(c.start) + time.Second) }

// A deadline gate reads Q from the policy's wait queue: behind three
// waiters of a 30 ms service on one slot (90 ms predicted), a request with
// 110 ms left is refused by the deadline gate itself (90 + 30 ≥ 110),
// before it reaches the slot's queue.
func TestDeadlineReadsTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, err := policy.Parse("p.yaml", []byte(`version: 1
gates:
  - {name: in-time, kind: deadline, min_samples: 1, retest: 1h}
  - {name: pool, kind: concurrency, limit: 1, queue: {max_wait: 1s}}
`))
		if err != nil {
			t.Fatal(err)
		}
		rt, err := policy.Build(f, nil, policy.Options{Clock: bubbleClock{time.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for range 20 { // teach both the service time: 30 ms
			_, tk := rt.Chain.Decide(ctx, &sluice.Request{})
			time.Sleep(30 * time.Millisecond)
			tk.Done(sluice.OutcomeUseful)
		}
		_, holder := rt.Chain.Decide(ctx, &sluice.Request{})
		done := make(chan sluice.Ticket, 3)
		for range 3 {
			go func() {
				_, tk := rt.Chain.Decide(ctx, &sluice.Request{})
				done <- tk
			}()
		}
		synctest.Wait()
		// The class's first refusal goes through as a retest: one with 1 ms
		// left, which the queue refuses (it cannot start in time).
		first := &sluice.Request{Deadline: rt.Chain.Clock().Now().Add(time.Millisecond)}
		if d, _ := rt.Chain.Decide(ctx, first); d.Admitted || d.Gate != "pool" || !first.Retest() {
			t.Fatalf("the first refusal: %+v (a retest: %v); want the retest, refused by the queue", d, first.Retest())
		}
		r := &sluice.Request{Deadline: rt.Chain.Clock().Now().Add(110 * time.Millisecond)}
		if d, _ := rt.Chain.Decide(ctx, r); d.Admitted || d.Reason != sluice.ReasonDeadline || d.Gate != "in-time" {
			t.Errorf("with 90 ms queued ahead: %+v; want the deadline gate's refusal", d)
		}
		holder.Done(sluice.OutcomeUseful)
		for range 3 {
			(<-done).Done(sluice.OutcomeUseful)
		}
	})
}
