package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/fakeclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is a fake clock a Retrier sleeps on: Sleep moves it and records
// the wait, so a test replays exactly without sleeping.
type fake struct {
	clk   *fakeclock.Clock
	mu    sync.Mutex
	waits []time.Duration
	also  func(time.Duration) // also called with each wait (nil: none)
}

func newFake() *fake { return &fake{clk: fakeclock.New(int64(time.Hour))} }

func (f *fake) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	f.clk.Advance(d)
	if f.also != nil {
		f.also(d)
	}
	return ctx.Err()
}

// retrier returns a Retrier on f with seed and opts.
func (f *fake) retrier(t testing.TB, seed uint64, opts Options) *Retrier {
	t.Helper()
	opts.Clock, opts.Sleep, opts.Rand = f.clk, f.sleep, rand.NewPCG(seed, 7)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
