package rls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sredis "github.com/sluice-go/sluice/store/redis"
)

// Bad input is refused with ErrInvalid naming what is wrong, before any
// store work: a Server whose Redis is unreachable still answers
// ErrInvalid (not ErrUnavailable), and counts nothing but the call.
func TestBadInput(t *testing.T) {
	st, err := sredis.New(sredis.Options{Addrs: []string{"127.0.0.1:1"}, Timeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := New(mustParse(t, conformanceConfig), Options{Redis: st})
	if err != nil {
		t.Fatal(err)
	}
	many := make([]Descriptor, 10_000)
	for i := range many {
		many[i] = d("tenant", fmt.Sprint(i))
	}
	long := make([]Entry, DefaultMaxEntries+1)
	for i := range long {
		long[i] = Entry{"k", "v"}
	}
	big := uint64(MaxHits) + 1
	for _, tc := range []struct {
		r    *Request
		want string
	}{
		{nil, "no request"},
		{&Request{Descriptors: []Descriptor{d("k", "v")}}, "domain must not be empty"},
		{&Request{Domain: strings.Repeat("d", MaxNameBytes+1), Descriptors: []Descriptor{d("k", "v")}}, "domain of 4097 bytes"},
		{&Request{Domain: "edge"}, "descriptor list must not be empty"},
		{&Request{Domain: "edge", Descriptors: many}, "10000 descriptors, more than the 64"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{{}}}, "descriptors[0] has no entries"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{d("k", "v"), {Entries: long}}}, "descriptors[1] has 33 entries, more than 32"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{d("", "v")}}, "descriptors[0].entries[0].key is empty"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{d("k", strings.Repeat("v", MaxNameBytes+1))}}, "entries[0] is longer than 4096 bytes"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{dh(big, "k", "v")}}, "hits_addend 4294967296 is more than 4294967295"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{dover(1, UnitUnknown, "k", "v")}}, "limit.unit 0 is not a unit"},
		{&Request{Domain: "edge", Descriptors: []Descriptor{dover(1, Week+1, "k", "v")}}, "limit.unit 8 is not a unit"},
	} {
		_, err := s.ShouldRateLimit(context.Background(), tc.r)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want ErrInvalid with %q", err, tc.want)
		}
	}
	if got := counter(t, s, "sluice_rls_calls_total", "invalid"); got != 12 {
		t.Errorf("%v invalid calls counted, want 12", got)
	}
	if got := counter(t, s, mHits, "edge", "tenant"); got != 0 {
		t.Errorf("hits counted for refused calls: %v", got)
	}
	// Options can raise the bounds.
	s2, err := New(mustParse(t, conformanceConfig), Options{MaxDescriptors: 20_000, OnFailure: FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.ShouldRateLimit(context.Background(), &Request{Domain: "edge", Descriptors: many}); err != nil {
		t.Errorf("10k descriptors under MaxDescriptors 20000: %v", err)
	}
}

func TestRejectUnknownDomain(t *testing.T) {
	s, _ := backend{name: "memory"}.server(t, mustParse(t, conformanceConfig), Options{RejectUnknownDomain: true})
	_, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "nope", Descriptors: []Descriptor{d("k", "v")}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `unknown domain "nope"`) {
		t.Errorf("%v", err)
	}
	if got := counter(t, s, "sluice_rls_domain_not_found_total", "nope"); got != 1 {
		t.Errorf("domain_not_found %v", got)
	}
}

func TestOptionsRefused(t *testing.T) {
	cfg := mustParse(t, conformanceConfig)
	for _, o := range []Options{{NearLimitRatio: 1.5}, {NearLimitRatio: -1}, {OnFailure: 9}, {Headers: 9}} {
		if _, err := New(cfg, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("a nil configuration accepted")
	}
}

const extConfig = `
domain: ext
descriptors:
  - key: api_key
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 10, burst: 20}
  - key: tenant
    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 2, burst: 2}
  - key: path
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 4}
  - key: upload
    rate_limit: {name: uploads, algorithm: concurrency, limit: 2}
  - key: shadow_bucket
    shadow_mode: true
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 1}
  - key: login
    rate_limit: {algorithm: sliding_log, unit: minute, requests_per_unit: 2}
`

// The extension algorithms decide as their sluice limiters, in the same
// protocol: a token bucket's burst and refill, GCRA, a sliding window, a
// sliding log, and concurrency slots taken by hits and released by
// is_negative_hits.
func TestExtensions(t *testing.T) {
	cfg := mustParse(t, extConfig)
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, cfg, Options{Headers: HeadersDraft})
			run(t, s, clk, "ext", []call{
				// token bucket: 20 at once, then 10 per second
				{at: 1000, hits: 20, descs: []Descriptor{d("api_key", "k")}, overall: CodeOK, want: []ws{{code: CodeOK, rpu: 10, unit: Second, remaining: 0, reset: 2}}},
				{descs: []Descriptor{d("api_key", "k")}, overall: CodeOverLimit, want: []ws{over(10, Second, 2)}},
				{at: 1001, hits: 10, descs: []Descriptor{d("api_key", "k")}, overall: CodeOK, want: []ws{{code: CodeOK, rpu: 10, unit: Second, remaining: 0, reset: 2}}},
				// a check (hits 0) is over when nothing is left
				// (checks and refunds on an extension rule report no reset)
				{descs: []Descriptor{dh(0, "api_key", "k")}, overall: CodeOverLimit, want: []ws{over(10, Second, 0)}},
				// a refund puts tokens back
				{descs: []Descriptor{dneg(5, "api_key", "k")}, overall: CodeOK, want: []ws{{code: CodeOK, rpu: 10, unit: Second, remaining: 5}}},
				// gcra 2/s burst 2
				{repeat: 1, descs: []Descriptor{d("tenant", "t")}, overall: CodeOK},
				{descs: []Descriptor{d("tenant", "t")}, overall: CodeOverLimit},
				// sliding window 4/minute
				{repeat: 3, descs: []Descriptor{d("path", "/p")}, overall: CodeOK},
				{descs: []Descriptor{d("path", "/p")}, overall: CodeOverLimit},
				// sliding log 2/minute, exact
				{repeat: 1, descs: []Descriptor{d("login", "l")}, overall: CodeOK},
				{descs: []Descriptor{d("login", "l")}, overall: CodeOverLimit},
				// a shadow-mode bucket never says over, and counts it
				{repeat: 1, descs: []Descriptor{d("shadow_bucket", "s")}, overall: CodeOK,
					stats: []stat{st(mShadow, "shadow_bucket", 1), st(mOver, "shadow_bucket", 1)}},
			})
			// concurrency: two slots; a release frees one
			take := func(neg bool, hits uint64) *Response {
				desc := dh(hits, "upload", "u")
				desc.Negative = neg
				resp, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "ext", Descriptors: []Descriptor{desc}})
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			for i, want := range []struct {
				neg       bool
				hits      uint64
				code      Code
				remaining uint32
			}{{false, 1, CodeOK, 1}, {false, 1, CodeOK, 0}, {false, 1, CodeOverLimit, 0}, {true, 1, CodeOK, 1}, {false, 1, CodeOK, 0},
				{true, 2, CodeOK, 2}, {true, 1, CodeOK, 2}, {false, 3, CodeOverLimit, 0}, {false, 0, CodeOK, 2}} {
				resp := take(want.neg, want.hits)
				st := resp.Statuses[0]
				if st.Code != want.code || st.Remaining != want.remaining || st.Limit == nil || st.Limit.RequestsPerUnit != 2 || st.Limit.Unit != UnitUnknown || st.ResetIn != 0 {
					t.Errorf("concurrency step %d: %+v %+v, want %s remaining %d", i, st, st.Limit, codeName(want.code), want.remaining)
				}
				if i == 0 && fmt.Sprint(resp.Headers) != `[{RateLimit-Policy "uploads";q=2;qu="concurrent-requests"} {RateLimit "uploads";r=1}]` {
					t.Errorf("headers %v", resp.Headers)
				}
			}
			if got := counter(t, s, "sluice_rls_release_unmatched_total"); got != 1 {
				t.Errorf("unmatched releases %v, want 1", got)
			}
		})
	}
}

// A permit whose release never comes is freed after ConcurrencyTTL.
func TestConcurrencyTTL(t *testing.T) {
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, mustParse(t, extConfig), Options{ConcurrencyTTL: 10 * time.Second})
			run(t, s, clk, "ext", []call{
				{at: 1000, repeat: 1, descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
				{at: 1011, descs: []Descriptor{d("upload", "y")}, overall: CodeOK}, // sweeps x's permits
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
			})
		})
	}
}

// Counter state carries over a reload; a changed extension rule starts
// fresh, an unchanged one keeps its state, and a concurrency rule with new
// slots keeps its permits in flight.
func TestSetConfig(t *testing.T) {
	s, clk := backend{name: "memory"}.server(t, mustParse(t, extConfig+"  - {key: w, rate_limit: {unit: minute, requests_per_unit: 3}}\n"), Options{})
	run(t, s, clk, "ext", []call{{at: 1200, repeat: 2, descs: []Descriptor{d("w", "1"), dh(20, "api_key", "k"), d("upload", "u")}, overall: CodeOverLimit,
		want: []ws{ok(3, Minute, 0, 60), over(10, Second, 2), {code: CodeOK, rpu: 2, name: "uploads"}}}}) // the refused calls' upload slots are given back: one held
	next := mustParse(t, strings.Replace(extConfig, "limit: 2}", "limit: 5}", 1)+"  - {key: w, rate_limit: {unit: minute, requests_per_unit: 4}}\n")
	if err := s.SetConfig(next); err != nil {
		t.Fatal(err)
	}
	run(t, s, clk, "ext", []call{{descs: []Descriptor{dh(0, "w", "1"), dh(1, "api_key", "k"), d("upload", "u")}, overall: CodeOverLimit,
		want: []ws{ok(4, Minute, 1, 60), over(10, Second, 2), {code: CodeOK, rpu: 5, remaining: 3, name: "uploads"}}}}) // the one held carried over
	if s.Config() != next {
		t.Error("Config() is not the configuration set")
	}
	if err := s.SetConfig(nil); err == nil {
		t.Error("nil configuration accepted")
	}
}

// Limits Redis cannot hold exactly are refused at New, naming the rule.
func TestRedisLimitsRefused(t *testing.T) {
	st, err := sredis.New(sredis.Options{Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 1, burst: 100000000}\n")
	_, err = New(cfg, Options{Redis: st})
	if err == nil || !strings.Contains(err.Error(), "inline.yaml:4: k:") {
		t.Errorf("%v", err)
	}
	if _, err := New(cfg, Options{}); err != nil {
		t.Errorf("memory: %v", err)
	}
}

// Metric label pairs are capped: the rest count under OtherKey.
func TestMetricKeysCapped(t *testing.T) {
	s, clk := backend{name: "memory"}.server(t, mustLoad(t, "testdata/basic.yaml"), Options{MaxMetricKeys: 3})
	clk.Set(sec(1200))
	for i := range 10 {
		if _, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "test-domain", Descriptors: []Descriptor{d("key7", fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter(t, s, mHits, "test-domain", OtherKey); got != 7 {
		t.Errorf("hits under %s: %v, want 7", OtherKey, got)
	}
	if got := counter(t, s, mHits, "test-domain", "key7_2"); got != 1 {
		t.Errorf("key7_2: %v", got)
	}
	for i := range 10 {
		s.ShouldRateLimit(context.Background(), &Request{Domain: fmt.Sprint("unknown", i), Descriptors: []Descriptor{d("k", "v")}})
	}
	if got := counter(t, s, "sluice_rls_domain_not_found_total", OtherKey); got != 7 {
		t.Errorf("unknown domains under %s: %v, want 7", OtherKey, got)
	}
}

// Two Servers on one registry (a reload by replacement) share counters.
func TestSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := mustParse(t, conformanceConfig)
	for range 2 {
		s, clk := backend{name: "memory"}.server(t, cfg, Options{Registry: reg})
		clk.Set(sec(1200))
		if _, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "edge", Descriptors: []Descriptor{d("tenant", "a")}}); err != nil {
			t.Fatal(err)
		}
		_ = s
	}
	s, _ := backend{name: "memory"}.server(t, cfg, Options{Registry: reg})
	if got := counter(t, s, mHits, "edge", "tenant"); got != 2 {
		t.Errorf("hits %v, want 2 from both Servers", got)
	}
}

// Distinct descriptors never share a counter, whatever their bytes
// (the peer's underscore-joined keys would join ("a_b","c") and ("a","b_c")).
func TestCounterKeysDistinct(t *testing.T) {
	seen := map[string][]Entry{}
	for _, e := range [][]Entry{
		ents("a_b", "c"), ents("a", "b_c"), ents("a", "b|c=d"), ents("a", "b", "c", "d"), ents("a=b", ""), ents("a", "=b"),
		ents("a", "%7C"), ents("a", "|"), ents("{a}", "b"),
	} {
		k := counterKey("dom", e, nil)
		if prev, dup := seen[k]; dup {
			t.Errorf("%v and %v share key %q", prev, e, k)
		}
		seen[k] = e
		if strings.ContainsAny(k, "{}") {
			t.Errorf("key %q holds a brace (it would move the Redis hash tag)", k)
		}
	}
}
