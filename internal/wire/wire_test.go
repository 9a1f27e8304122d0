package wire

import (
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

func TestSecondsNeverZeroForAWait(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, 1: 1, time.Millisecond: 1, time.Second: 1,
		time.Second + 1: 2, 5 * time.Second: 5, math.MaxInt64: 9223372037} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestRetryAfterJitterRange(t *testing.T) {
	j := Jitter{Fraction: 0.5, Min: 1}
	for _, wait := range []time.Duration{10 * time.Millisecond, 3 * time.Second, 10 * time.Second} {
		base := Seconds(wait)
		spread := spread(j, base)
		seen := map[int64]bool{}
		for r := uint64(0); r < 1000; r++ {
			v := RetryAfter(wait, j, r)
			if v < base || v > base+spread {
				t.Fatalf("wait %v: %d outside [%d, %d]", wait, v, base, base+spread)
			}
			seen[v] = true
		}
		if int64(len(seen)) != spread+1 {
			t.Fatalf("wait %v: %d distinct values, want %d", wait, len(seen), spread+1)
		}
	}
	if RetryAfter(0, j, 7) != 0 {
		t.Fatal("jitter invented a wait")
	}
	if RetryAfter(1500*time.Millisecond, Jitter{}, 99) != 2 {
		t.Fatal("zero jitter is not exact")
	}
}

func TestStatus(t *testing.T) {
	for _, c := range []struct {
		d    sluice.Decision
		want int
	}{
		{sluice.Decision{Admitted: true}, 200},
		{sluice.Decision{Reason: sluice.ReasonInvalid}, 400},
		{sluice.Decision{Reason: sluice.ReasonPolicyRate}, 429},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeTenant}, 429},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService}, 503},
		{sluice.Decision{Reason: sluice.ReasonOverload}, 503},
		{sluice.Decision{Reason: sluice.ReasonDeadline}, 503},
		{sluice.Decision{Reason: sluice.ReasonDependency}, 503},
		{sluice.Decision{Reason: sluice.ReasonUpstream, EffectPossible: true}, 502},
		{sluice.Decision{Reason: sluice.ReasonDeadline, EffectPossible: true}, 504},
	} {
		if got := Status(&c.d); got != c.want {
			t.Errorf("%+v: %d, want %d", c.d, got, c.want)
		}
	}
	_ = http.StatusOK
}

func TestHeaderFields(t *testing.T) {
	got := string(AppendPolicies(nil, []sluice.Policy{
		{Name: "burst", Quota: 500, Window: 5 * time.Second},
		{Name: `we"ird\`, Quota: 20, Unit: sluice.UnitConcurrentRequests},
		{Name: "huge", Quota: 1 << 62, Window: 1500 * time.Millisecond},
		{Name: "half", Quota: 50, Window: 500 * time.Millisecond},       // 100/s, burst 50
		{Name: "hourly", Quota: 1, Window: time.Hour},                   // 1/h, burst 1
		{Name: "third", Quota: 7, Window: 2333333334 * time.Nanosecond}, // 3/s, burst 7
	}))
	want := `"burst";q=500;w=5, "we\"ird\\";q=20;qu="concurrent-requests", "huge";q=999999999999999;w=2, ` +
		`"half";q=100;w=1;sluice-burst=50, "hourly";q=1;w=3600, "third";q=6;w=2;sluice-burst=7`
	if got != want {
		t.Fatalf("policy\n got %s\nwant %s", got, want)
	}
	if got := string(AppendRateLimit(nil, "burst\x00é", 0, 7)); got != `"burst???";r=0;t=7` {
		t.Fatalf("ratelimit %s", got)
	}
	if got := string(AppendRateLimit(nil, "x", 3, 0)); got != `"x";r=3` {
		t.Fatalf("ratelimit without reset %s", got)
	}
}

func TestTemplateMatchesEnvelope(t *testing.T) {
	for _, d := range []sluice.Decision{
		{Reason: sluice.ReasonPolicyRate, Gate: "request-rate", Limit: 500, Window: 5 * time.Second, Scope: sluice.ScopeTenant, Retryable: true},
		{Reason: sluice.ReasonPolicyRate, Gate: "q\"uote", Limit: 10, Scope: sluice.ScopeTenant},
		{Reason: sluice.ReasonOverload, Gate: "fleet-usage", Retryable: true},
		{Reason: sluice.ReasonConcurrency, Gate: "c", Limit: 3, Scope: sluice.ScopeTenant, Retryable: true},
	} {
		for _, retry := range []int64{0, 1, 42} {
			if !d.Retryable && retry > 0 {
				continue
			}
			for _, hide := range []bool{false, true} {
				msg := AppendMessage(nil, &d, 12, retry, hide, "")
				e := Envelope{Reason: d.Reason, Scope: d.Scope, Gate: d.Gate, Retryable: d.Retryable, RetryAfter: retry, RequestID: "id-1", Message: string(msg)}
				want := string(AppendEnvelope(nil, &e))
				got := string(NewEnvelopeTemplate(&d, 12, hide).Append(nil, retry, "id-1"))
				if got != want {
					t.Fatalf("template\n got %s\nwant %s", got, want)
				}
				var v map[string]map[string]any
				if err := json.Unmarshal([]byte(got), &v); err != nil {
					t.Fatalf("invalid JSON %s: %v", got, err)
				}
			}
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", `q"uote\`, "\x00\x1f", "é€😀", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var out string
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%q rendered as invalid JSON %s: %v", s, b, err)
		}
		sf := appendString(nil, s)
		for _, c := range sf {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("structured field string %q has byte %x", sf, c)
			}
		}
	})
}

// A window's quota is its limit per window; a bucket's is its sustained
// rate (in the smallest unit that gives a whole request) and its burst, so
// "1/s, burst 3" does not read as "3 requests per 3s".
func TestQuotaMessage(t *testing.T) {
	for _, c := range []struct {
		limit   int64
		window  time.Duration
		refills bool
		want    string
	}{
		{100, time.Minute, false, "(100 requests per 60s per tenant)"},
		{3, 3 * time.Second, true, "(1 request per second per tenant, in bursts of up to 3)"},
		{500, 5 * time.Second, true, "(100 requests per second per tenant, in bursts of up to 500)"},
		{10, 2 * time.Minute, true, "(5 requests per minute per tenant, in bursts of up to 10)"},
		{1, time.Hour, true, "(1 request per hour per tenant, in bursts of up to 1)"},
		{2, 3 * time.Hour, true, "(16 requests per day per tenant, in bursts of up to 2)"},
		{7, 3 * time.Second, true, "(2.33 requests per second per tenant, in bursts of up to 7)"},
		{1, 1000 * time.Hour, true, "(0.024 requests per day per tenant, in bursts of up to 1)"},
	} {
		d := sluice.Decision{Reason: sluice.ReasonPolicyRate, Gate: "g", Limit: c.limit, Window: c.window, Refills: c.refills,
			Scope: sluice.ScopeTenant, Retryable: true}
		if got := string(AppendMessage(nil, &d, 1, 0, false, "")); got != "g: rate limit exceeded "+c.want {
			t.Errorf("%d per %v (refills %v): %q", c.limit, c.window, c.refills, got)
		}
	}
}
