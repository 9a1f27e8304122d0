package redis

import (
	"fmt"
	"testing"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/storetest"
)

// Redis standalone and Redis Cluster pass the conformance suite of every
// store: each algorithm's script decides exactly as the algorithm, step
// for step, on Redis time set to the suite's clock.
func TestConformance(t *testing.T) {
	for bname, st := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			n := 0
			storetest.Run(t, storetest.Backend{New: func(alg any, now func() clock.Instant) (store.Limiter, error) {
				n++
				sp, err := SpecOf(fmt.Sprint("conf", n), alg)
				if err != nil {
					return nil, err
				}
				l := st.Limiter(sp).(*limiter)
				l.now = func() int64 { return int64(now()) / 1000 } // µs
				return l, nil
			}, Rebind: func(lim store.Limiter, alg any) (store.Limiter, error) {
				old := lim.(*limiter)
				sp, err := SpecOf(old.name, alg) // the same name: the same keys
				if err != nil {
					return nil, err
				}
				l := st.Limiter(sp).(*limiter)
				l.now = old.now
				return l, nil
			}})
		})
	}
}
