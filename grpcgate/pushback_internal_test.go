package grpcgate

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/wire"
)

func TestPushbackValues(t *testing.T) {
	retry := func(d time.Duration) *sluice.Decision {
		return &sluice.Decision{Reason: sluice.ReasonPolicyRate, Retryable: true, RetryAfter: d}
	}
	off := wire.Jitter{}
	for _, tc := range []struct {
		name     string
		d        *sluice.Decision
		j        wire.Jitter
		rnd      uint64
		ms, secs int64
	}{
		{"invalid", &sluice.Decision{Reason: sluice.ReasonInvalid}, off, 0, noPushback, 0},
		{"not retryable", &sluice.Decision{Reason: sluice.ReasonPolicyRate}, off, 0, dontRetry, 0},
		{"no wait known", retry(0), off, 0, noPushback, 0},
		{"exact ms", retry(10 * time.Millisecond), off, 0, 10, 1},
		{"rounded up", retry(1500 * time.Microsecond), off, 0, 2, 1},
		{"a nanosecond", retry(1), off, 0, 1, 1},
		{"seconds", retry(2 * time.Second), off, 0, 2000, 2},
		{"clamped", retry(1000 * time.Hour), off, 0, math.MaxInt32, (math.MaxInt32 + 999) / 1000},
		// Default jitter: [w, w + max(⌈w/2⌉, 1 s)].
		{"default lowest", retry(10 * time.Millisecond), wire.DefaultJitter, 0, 10, 1},
		{"default highest", retry(10 * time.Millisecond), wire.DefaultJitter, 1000, 1010, 2},
		{"default wraps", retry(10 * time.Millisecond), wire.DefaultJitter, 1001, 10, 1},
		{"fraction", retry(4 * time.Second), wire.Jitter{Fraction: 0.5}, 2000, 6000, 6},
		{"clamped jitter", retry(1000 * time.Hour), wire.DefaultJitter, math.MaxUint64, math.MaxInt32, (math.MaxInt32 + 999) / 1000},
	} {
		ms, secs := pushback(tc.d, tc.j, tc.rnd)
		if ms != tc.ms || secs != tc.secs {
			t.Errorf("%s: pushback %d ms, %d s; want %d, %d", tc.name, ms, secs, tc.ms, tc.secs)
		}
	}
}
