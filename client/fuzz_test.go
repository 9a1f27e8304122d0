package client

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/wire"
)

// What sluice writes, the client reads back.
func TestParseWhatWireWrites(t *testing.T) {
	rl := string(wire.AppendRateLimit(nil, `odd "name"`, 7, 30))
	ls, err := ParseRateLimit(rl + `, other;r=0`)
	if err != nil || len(ls) != 2 || ls[0] != (Limit{Policy: `odd "name"`, Remaining: 7, Reset: 30 * time.Second}) ||
		ls[1] != (Limit{Policy: "other"}) {
		t.Fatalf("%q: %+v %v", rl, ls, err)
	}
	pol := string(wire.AppendPolicies(nil, []sluice.Policy{{Name: "rate", Quota: 50, Window: 500 * time.Millisecond},
		{Name: "inflight", Quota: 20, Unit: sluice.UnitConcurrentRequests}}))
	qs, err := ParsePolicy(pol)
	if err != nil || len(qs) != 2 || qs[0] != (Quota{Policy: "rate", Quota: 100, Window: time.Second}) || qs[1] != (Quota{Policy: "inflight", Quota: 20}) {
		t.Fatalf("%q: %+v %v", pol, qs, err)
	}
	for _, bad := range []string{"", `"a"`, `"a";r=-1`, `"a";r=1.5`, `"a";r=1,`, `"unterminated`, `1;r=2`, `"a";r=9999999999999999`, `"a";r`} {
		if _, err := ParseRateLimit(bad); err == nil {
			t.Errorf("ParseRateLimit(%q): no error", bad)
		}
	}
}

// Both refusal bodies sluice writes, the envelope and the problem
// details object (--problem-details), tell the client the same: a
// problem+json refusal's "retryable": false was read as no envelope at all,
// and a 429 that can never be admitted was retried.
func TestBothRefusalBodiesAreRead(t *testing.T) {
	for _, e := range []wire.Envelope{{Reason: sluice.ReasonPolicyRate, Retryable: false, EffectPossible: false},
		{Reason: sluice.ReasonOverload, Retryable: true, EffectPossible: false},
		{Reason: sluice.ReasonOverload, Retryable: false, EffectPossible: true}} {
		want := envelope{Retryable: e.Retryable, EffectPossible: e.EffectPossible}
		if got, ok := parseEnvelope(wire.AppendEnvelope(nil, &e), false); !ok || got != want {
			t.Errorf("envelope %+v: read %+v %v", e, got, ok)
		}
		if got, ok := parseEnvelope(wire.AppendProblem(nil, &e, 429), true); !ok || got != want {
			t.Errorf("problem details %+v: read %+v %v", e, got, ok)
		}
		// Each shape only under its own media type.
		if _, ok := parseEnvelope(wire.AppendProblem(nil, &e, 429), false); ok {
			t.Errorf("a problem details body read as an envelope")
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	date := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		err  bool
	}{
		{"3", 3 * time.Second, false}, {" 120 ", 2 * time.Minute, false}, {"0", 0, false},
		{"99999999999999999999999", 24 * time.Hour, false},
		{"Fri, 02 Jan 2026 03:04:15 GMT", 10 * time.Second, false}, {"Fri, 02 Jan 2026 03:00:00 GMT", 0, false},
		{"-1", 0, true}, {"1.5", 0, true}, {"soon", 0, true}, {"", 0, true},
	} {
		got, err := parseRetryAfter(c.v, date)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v (error %v)", c.v, got, err, c.want, c.err)
		}
	}
}

// The parsers of what a server sends never panic, and what they accept is
// in range.
func FuzzParseRateLimit(f *testing.F) {
	for _, s := range []string{`"rate";r=5;t=30`, `a;r=0, "b";r=1;t=2;x="y";z=?1;w=tok`, `"a";q=10;w=60`, `"\"";r=1`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ls, err := ParseRateLimit(s); err == nil {
			for _, l := range ls {
				if l.Remaining < 0 || l.Reset < 0 || l.Reset > 24*time.Hour {
					t.Fatalf("%q: %+v", s, l)
				}
			}
		}
		if qs, err := ParsePolicy(s); err == nil {
			for _, q := range qs {
				if q.Quota < 0 || q.Window < 0 || q.Window > 24*time.Hour {
					t.Fatalf("%q: %+v", s, q)
				}
			}
		}
	})
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"3", "Fri, 02 Jan 2026 03:04:15 GMT", "Monday, 02-Jan-06 15:04:05 MST", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseRetryAfter(s, time.Unix(1.7e9, 0))
		if err == nil && (d < 0 || d > 24*time.Hour) {
			t.Fatalf("%q: %v", s, d)
		}
	})
}

func FuzzParseEnvelope(f *testing.F) {
	f.Add([]byte(`{"error":{"retryable":true,"effect_possible":false}}`))
	f.Add([]byte(`{"error":null}`))
	f.Add([]byte(`[1,2`))
	f.Add([]byte(`{"type":"about:blank","retryable":false,"effect_possible":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseEnvelope(b, false)
		parseEnvelope(b, true)
	})
}
