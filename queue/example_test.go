package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

// One slot with a wait queue in front: a second request waits for the
// slot instead of being turned away and gets it when the first is done; a
// third, with nobody done before its 50 ms are up, is refused with reason
// queue (503); a fourth, whose deadline leaves it less than its class's
// service time, is refused at once with reason deadline.
func ExampleNew() {
	c, _ := limit.NewConcurrency(1)
	pool, _ := gate.NewInFlight("worker-pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	q, _ := queue.New("worker-pool", pool, queue.Options{MaxWait: 50 * time.Millisecond,
		ServiceTime: func(string) time.Duration { return 20 * time.Millisecond }})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, q)
	ctx := context.Background()

	_, first := chain.Decide(ctx, &sluice.Request{})
	second, done := make(chan sluice.Decision), make(chan struct{})
	go func() {
		defer close(done)
		d, tk := chain.Decide(ctx, &sluice.Request{})
		second <- d
		time.Sleep(100 * time.Millisecond) // the second's work, holding the slot
		tk.Done(sluice.OutcomeUseful)
	}()
	time.Sleep(10 * time.Millisecond)
	first.Done(sluice.OutcomeUseful)
	fmt.Println("second admitted:", (<-second).Admitted)

	d, _ := chain.Decide(ctx, &sluice.Request{})
	fmt.Println("third:", d.Reason)
	d, _ = chain.Decide(ctx, &sluice.Request{Deadline: clock.Now().Add(10 * time.Millisecond)})
	fmt.Println("fourth:", d.Reason)
	<-done
	// Output:
	// second admitted: true
	// third: queue
	// fourth: deadline
}
