package limit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in     string
		tokens int64
		per    time.Duration
	}{
		{"100/s", 1, 10 * time.Millisecond},
		{"200/s", 1, 5 * time.Millisecond},
		{"3/s", 3, time.Second},
		{"1/h", 1, time.Hour},
		{"2.5/s", 1, 400 * time.Millisecond},
		{"1e9/s", 1, time.Nanosecond},
		{"1000/10s", 1, 10 * time.Millisecond},
		{"2.7/s", 27, 10 * time.Second},
		{"30/60s", 1, 2 * time.Second},
		{"1/0.5s", 1, 500 * time.Millisecond},
		{"1/µs", 1, time.Microsecond},
		{"0.001/ms", 1, time.Second},
		{"5/m", 1, 12 * time.Second},
		{"1/d", 1, 24 * time.Hour},
		{"7/1m30s", 7, 90 * time.Second},
	} {
		r, err := ParseRate(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if r.Tokens() != c.tokens || r.Per() != c.per {
			t.Errorf("%q: %d per %v, want %d per %v", c.in, r.Tokens(), r.Per(), c.tokens, c.per)
		}
	}
}

func TestParseRateErrors(t *testing.T) {
	for _, in := range []string{"", "100", "100/x", "100/", "/s", "0/s", "-5/s", "abc/s", "1.2.3/s",
		"1e99/s", "99999999999999999999/s", "1/0s", "1/-1s", "NaN/s", "Inf/s", "1e-30/s",
		// Spellings that are not documented are refused, not guessed.
		"10/sec", "10/second", "10/min", "5/minute", "1/hour", "1/day", "10/S", " 30 / 60s ", "10/ s", "1/+1s", "1/s/s"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("%q: no error", in)
		} else if !errors.Is(err, ErrInvalidRate) {
			t.Errorf("%q: %v does not wrap ErrInvalidRate", in, err)
		}
	}
}

// A refused word names the unit meant.
func TestParseRateNamesTheUnit(t *testing.T) {
	if _, err := ParseRate("10/sec"); err == nil || !strings.Contains(err.Error(), `write "s"`) {
		t.Fatalf("%v", err)
	}
}

func TestRateFromFloat(t *testing.T) {
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -1, 1e-300} {
		if _, err := rateFromFloat(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	r, err := rateFromFloat(2.5)
	if err != nil || r.Tokens() != 1 || r.Per() != 400*time.Millisecond {
		t.Fatalf("2.5: %v %v", r, err)
	}
	r, err = rateFromFloat(1e9)
	if err != nil || r.Per() != time.Nanosecond {
		t.Fatalf("1e9: %v %v", r, err)
	}
}

func TestNewRateErrors(t *testing.T) {
	for _, c := range []struct {
		n   int64
		per time.Duration
	}{{0, time.Second}, {-1, time.Second}, {1, 0}, {1, -time.Second}} {
		if _, err := NewRate(c.n, c.per); err == nil {
			t.Errorf("NewRate(%d, %v): no error", c.n, c.per)
		}
	}
}

func TestRateString(t *testing.T) {
	for in, want := range map[string]string{"100/s": "1/10ms", "3/s": "3/s", "1/h": "1/h", "2.5/s": "1/400ms", "2.7/s": "27/10s"} {
		if got := mustRate(t, in).String(); got != want {
			t.Errorf("%s → %s, want %s", in, got, want)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100/s", "2.5/s", "1e9/s", "1/h", "7/1m30s", "0/s", "1e-9/ns", "9223372036854775807/ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r.Tokens() <= 0 || r.Per() <= 0 || gcd(r.Tokens(), int64(r.Per())) != 1 {
			t.Fatalf("%q parsed to invalid %d/%d", s, r.Tokens(), r.Per())
		}
		// A parsed rate must build a bucket or give a clean error.
		if b, err := NewTokenBucket(r, 1); err == nil {
			var st TokenBucketState
			b.Take(&st, 0, 1)
		}
	})
}
