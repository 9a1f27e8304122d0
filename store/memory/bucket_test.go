package memory

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/limit"
)

// Concurrent callers on one bucket admit exactly the burst: no lost update
// on either the CAS path (integral interval) or the mutex path (fractional).
func TestBucketConcurrentExactBurst(t *testing.T) {
	for _, rs := range []string{"1/h", "7/3h"} {
		rate, _ := limit.ParseRate(rs)
		tb, _ := limit.NewTokenBucket(rate, 1000)
		clk := fakeclock.New(0)
		b, _ := NewBucket(tb.Rate(), tb.Limit(), clk)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 500 {
					ok := false
					if i%2 == 0 {
						ok = b.Allow(1)
					} else {
						ok = b.Take(1).OK()
					}
					if ok {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 1000 {
			t.Fatalf("%s: admitted %d, want exactly 1000", rs, admitted.Load())
		}
	}
}

func TestBucketMatchesAlgorithm(t *testing.T) {
	for _, rs := range []string{"200/s", "3/s"} {
		rate, _ := limit.ParseRate(rs)
		tb, _ := limit.NewTokenBucket(rate, 400)
		clk := fakeclock.New(0)
		b, _ := NewBucket(tb.Rate(), tb.Limit(), clk)
		var s limit.TokenBucketState
		for i := range 2000 {
			clk.Set(int64(i) * int64(time.Millisecond) / 3)
			want := tb.Take(&s, clk.Now(), 1)
			got := b.Take(1)
			if got != want {
				t.Fatalf("%s step %d: bucket %+v, algorithm %+v", rs, i, got, want)
			}
		}
		b.Refund(1)
		b.Refund(400)
		if r := b.Take(400); !r.OK() {
			t.Fatalf("%s: refund did not restore a full bucket: %+v", rs, r)
		}
	}
}

func TestSingleRunsAnyAlgorithm(t *testing.T) {
	w, _ := limit.NewSlidingLog(2, time.Second)
	clk := fakeclock.New(0)
	l := newSingle(w, clk)
	for i, want := range []bool{true, true, false} {
		if l.Allow(1) != want {
			t.Fatalf("sliding log of 2 per second: call %d", i+1)
		}
	}
	clk.Advance(time.Second)
	if r := l.Take(1); !r.OK() || r.Remaining != 1 {
		t.Fatalf("%+v", r)
	}
	l.Refund(1)
	if r := l.Take(2); !r.OK() {
		t.Fatalf("%+v", r)
	}
}
