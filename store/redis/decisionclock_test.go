package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// With a DecisionClock the scripts decide at its time, not Redis TIME: a
// fixed window rolls over when that clock crosses the boundary, and a
// store shared from it (Share) keeps the clock.
func TestDecisionClock(t *testing.T) {
	srv := redistest.Start(t)
	clk := fakeclock.New(int64(1199 * time.Second)) // one second before a minute ends
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second, DecisionClock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fw, _ := limit.NewFixedWindow(1, time.Minute)
	for name, s := range map[string]*Store{"own": st, "shared": mustShare(t, st)} {
		lim, err := bind(s)(fixedWindowSpec("dc-"+name, fw))
		if err != nil {
			t.Fatal(err)
		}
		clk.Set(int64(1199 * time.Second))
		ctx := context.Background()
		for i, want := range []limit.Status{limit.Allowed, limit.Denied} {
			r, _, err := lim.Take(ctx, "k", clk.Now(), 1, 0)
			if err != nil || r.Status != want || (want == limit.Denied && r.RetryAfter != time.Second) {
				t.Fatalf("%s: take %d: %+v %v, want %v (retry 1s)", name, i, r, err, want)
			}
		}
		clk.Set(int64(1200 * time.Second))
		if r, _, err := lim.Take(ctx, "k", clk.Now(), 1, 0); err != nil || r.Status != limit.Allowed {
			t.Fatalf("%s: after the boundary: %+v %v", name, r, err)
		}
	}
}

func mustShare(t *testing.T, st *Store) *Store {
	t.Helper()
	sh, err := st.Share(st.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	return sh
}
