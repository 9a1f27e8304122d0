package queue_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

// The gates after a queue decide at the time the queue let the request
// go: a pacer after it computed its wait from the instant before the
// queue's wait, and released the request 10 ms after its deadline (found by
// a review run). Its slot at +100 ms now comes 20 ms after the queue's
// grant at +80, within the deadline at +170.
func TestGatesAfterAQueueDecideAtTheGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk})
		lb, _ := limit.NewLeakyBucket(limit.PerSecond(10), 5)
		pc, err := gate.NewPacer("pace", memory.NewKeyed(lb, memory.Options{}), gate.Options{})
		if err != nil {
			t.Fatal(err)
		}
		chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, q, pc)
		ctx := context.Background()
		t0 := clk.Now()
		da, ta := chain.Decide(ctx, &sluice.Request{}) // the slot; the pacer's next at +100 ms
		if !da.Admitted {
			t.Fatal(da)
		}
		go func() { time.Sleep(80 * time.Millisecond); ta.Done(sluice.OutcomeUseful) }()
		b := &sluice.Request{Deadline: t0.Add(170 * time.Millisecond)}
		db, tb := chain.Decide(ctx, b)
		if at := clk.Now(); !db.Admitted || at.Sub(t0) != 100*time.Millisecond {
			t.Fatalf("admitted %v (%v), released at +%v; want its pacer slot at +100ms", db.Admitted, db.Reason, at.Sub(t0))
		}
		tb.Done(sluice.OutcomeUseful)
	})
}

type bubbleClock struct{ start time.Time }

func (c bubbleClock) Now() clock.Instant { return clock.Instant(time.Since(c.start) + time.Hour) }
