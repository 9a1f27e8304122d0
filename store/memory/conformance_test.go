package memory_test

import (
	"fmt"
	"testing"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	"github.com/sluice-go/sluice/store/storetest"
)

// The memory store passes the conformance suite of every store.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{New: func(alg any, _ func() clock.Instant) (store.Limiter, error) {
		o := memory.Options{}
		switch a := alg.(type) {
		case *limit.TokenBucket:
			return memory.NewKeyed(a, o), nil
		case *limit.GCRA:
			return memory.NewKeyed(a, o), nil
		case *limit.FixedWindow:
			return memory.NewKeyed(a, o), nil
		case *limit.SlidingWindow:
			return memory.NewKeyed(a, o), nil
		case *limit.SlidingLog:
			return memory.NewKeyed(a, o), nil
		case *limit.LeakyBucket:
			return memory.NewKeyed(a, o), nil
		case *limit.Concurrency:
			return memory.NewKeyed(a, o), nil
		}
		return nil, fmt.Errorf("no algorithm %T", alg)
	}})
}
