package grpcgate

import (
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/sluice-go/sluice"
)

func TestPushbackValues(t *testing.T) {
	retry := func(d time.Duration) *sluice.Decision {
		return &sluice.Decision{Reason: sluice.ReasonPolicyRate, Retryable: true, RetryAfter: d}
	}
	off := sluice.Jitter{}
	for _, tc := range []struct {
		name     string
		d        *sluice.Decision
		j        sluice.Jitter
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
		{"default lowest", retry(10 * time.Millisecond), sluice.DefaultJitter, 0, 10, 1},
		{"default highest", retry(10 * time.Millisecond), sluice.DefaultJitter, 1000, 1010, 2},
		{"default wraps", retry(10 * time.Millisecond), sluice.DefaultJitter, 1001, 10, 1},
		{"fraction", retry(4 * time.Second), sluice.Jitter{Fraction: 0.5}, 2000, 6000, 6},
		{"clamped jitter", retry(1000 * time.Hour), sluice.DefaultJitter, math.MaxUint64, math.MaxInt32, (math.MaxInt32 + 999) / 1000},
	} {
		ms, secs := pushback(tc.d, tc.j, tc.rnd)
		if ms != tc.ms || secs != tc.secs {
			t.Errorf("%s: pushback %d ms, %d s; want %d, %d", tc.name, ms, secs, tc.ms, tc.secs)
		}
	}
}

// A pushback the client cannot read as one 32-bit integer of at least 0
// means "do not retry", as grpc-go's own retries read it.
func TestPushbackOf(t *testing.T) {
	for _, c := range []struct {
		vals []string
		d    time.Duration
		ok   bool
	}{
		{nil, 0, false},
		{[]string{"0"}, 0, true},
		{[]string{"1500"}, 1500 * time.Millisecond, true},
		{[]string{"-1"}, -1, true},
		{[]string{"abc"}, -1, true},
		{[]string{"1.5"}, -1, true},
		{[]string{"99999999999"}, -1, true},
		{[]string{""}, -1, true},
		{[]string{"10", "20"}, -1, true},
	} {
		md := metadata.MD{}
		for _, v := range c.vals {
			md.Append(PushbackKey, v)
		}
		if d, ok := pushbackOf(md); d != c.d || ok != c.ok {
			t.Errorf("%q: %v, %v; want %v, %v", c.vals, d, ok, c.d, c.ok)
		}
	}
}
