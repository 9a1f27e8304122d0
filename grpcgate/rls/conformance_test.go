package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const conformanceConfig = `
domain: edge
descriptors:
  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: path, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: internal, rate_limit: {unlimited: true}}
  - {key: beta, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`

// The nine conformance cases of the protocol notes (the reference
// server's behaviour that clients rely on), on memory and Redis.
func TestConformance(t *testing.T) {
	cfg := mustParse(t, conformanceConfig)
	ctx := context.Background()
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("1_under_limit", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				for _, at := range []int64{1200, 1201, 1259} {
					clk.Set(sec(at))
					resp, err := s.ShouldRateLimit(ctx, &Request{Domain: "edge", Descriptors: []Descriptor{d("tenant", fmt.Sprint(at))}, Hits: 3})
					if err != nil {
						t.Fatal(err)
					}
					st := resp.Statuses[0]
					if resp.Overall != CodeOK || st.Code != CodeOK || st.Remaining != 10-3 || st.Limit == nil || st.Limit.RequestsPerUnit != 10 || st.Limit.Unit != Minute {
						t.Errorf("at %d: %+v %+v", at, resp, st.Limit)
					}
					if st.ResetIn <= 0 || st.ResetIn > time.Minute {
						t.Errorf("at %d: reset in %v, want (0, 1m]", at, st.ResetIn)
					}
				}
			})
			t.Run("2_second_over_limit", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{{at: 1230, repeat: 2, descs: []Descriptor{d("tenant", "a"), d("path", "/x")}, overall: CodeOverLimit,
					want: []ws{ok(10, Minute, 7, 30), over(2, Minute, 30)}}})
			})
			t.Run("3_hits_addend", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{
					{at: 1230, hits: 0, descs: []Descriptor{d("tenant", "h")}, overall: CodeOK, want: []ws{ok(10, Minute, 9, 30)}},
					{hits: 5, descs: []Descriptor{d("tenant", "h")}, overall: CodeOK, want: []ws{ok(10, Minute, 4, 30)}},
					{hits: 5, descs: []Descriptor{dh(0, "tenant", "h")}, overall: CodeOK, want: []ws{ok(10, Minute, 4, 30)}},
					{descs: []Descriptor{d("tenant", "h")}, overall: CodeOK, want: []ws{ok(10, Minute, 3, 30)}},
				})
			})
			t.Run("4_override", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{
					{at: 1230, repeat: 2, descs: []Descriptor{dover(3, Minute, "tenant", "o")}, overall: CodeOK, want: []ws{ok(3, Minute, 0, 30)}},
					{descs: []Descriptor{dover(3, Minute, "tenant", "o")}, overall: CodeOverLimit, want: []ws{over(3, Minute, 30)}},
				})
			})
			t.Run("5_unknown_and_unlimited", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{{at: 1230, descs: []Descriptor{d("nobody", "x"), d("internal", "x")}, overall: CodeOK,
					want: []ws{noLimit, unlimited}}})
			})
			t.Run("6_shadow", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{
					{at: 1230, repeat: 2, descs: []Descriptor{d("beta", "b")}, overall: CodeOK, want: []ws{ok(1, Minute, 0, 30)},
						stats: []stat{st(mHits, "beta", 3), st(mOver, "beta", 2), st(mShadow, "beta", 2)}},
				})
			})
			t.Run("7_empty_domain_or_descriptors", func(t *testing.T) {
				s, _ := b.server(t, cfg, Options{})
				for _, r := range []*Request{{Descriptors: []Descriptor{d("tenant", "x")}}, {Domain: "edge"}} {
					if _, err := s.ShouldRateLimit(ctx, r); !errors.Is(err, ErrInvalid) {
						t.Errorf("%+v: %v, want ErrInvalid", r, err)
					}
				}
			})
			t.Run("8_window_boundary", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				run(t, s, clk, "edge", []call{
					{at: 1259, repeat: 1, descs: []Descriptor{d("path", "/b")}, overall: CodeOK, want: []ws{ok(2, Minute, 0, 1)}},
					{descs: []Descriptor{d("path", "/b")}, overall: CodeOverLimit, want: []ws{over(2, Minute, 1)}},
					{at: 1260, descs: []Descriptor{d("path", "/b")}, overall: CodeOK, want: []ws{ok(2, Minute, 1, 60)}},
				})
			})
			t.Run("9_json", func(t *testing.T) {
				s, clk := b.server(t, cfg, Options{})
				clk.Set(sec(1230))
				h := &JSONHandler{Service: s}
				post := func(body string) (int, string) {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
					return rec.Code, rec.Body.String()
				}
				body := `{"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/j"}]}]}`
				for i, want := range []struct {
					code int
					body string
				}{
					{200, `{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":2,"unit":"MINUTE"},"limitRemaining":1,"durationUntilReset":"30s"}]}`},
					{200, `{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":2,"unit":"MINUTE"},"durationUntilReset":"30s"}]}`},
					{429, `{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":2,"unit":"MINUTE"},"durationUntilReset":"30s"}]}`},
				} {
					code, got := post(body)
					if code != want.code || got != want.body {
						t.Errorf("call %d: %d %s\n\twant %d %s", i, code, got, want.code, want.body)
					}
				}
				// The same call through ShouldRateLimit answers the same.
				req, err := DecodeRequest([]byte(body))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := s.ShouldRateLimit(ctx, req)
				if err != nil || resp.Overall != CodeOverLimit {
					t.Errorf("ShouldRateLimit: %+v, %v", resp, err)
				}
				if code, _ := post(`{"domain": ""}`); code != http.StatusBadRequest {
					t.Errorf("empty domain: %d, want 400", code)
				}
			})
		})
	}
}

// TestJSONHandler: both spellings of every field, 64-bit values as
// strings, enums by name or number, and the error statuses.
func TestJSONHandler(t *testing.T) {
	cfg := mustParse(t, conformanceConfig)
	s, clk := backend{name: "memory"}.server(t, cfg, Options{Headers: HeadersPeer})
	clk.Set(sec(1230))
	h := &JSONHandler{Service: s, MaxBody: 1 << 10}
	do := func(method, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/json", strings.NewReader(body)))
		return rec
	}
	for _, tc := range []struct {
		body string
		code int
		want string // a substring of the body
	}{
		{`{"domain":"edge","hitsAddend":4,"descriptors":[{"entries":[{"key":"tenant","value":"a"}]}]}`, 200, `"limitRemaining":6`},
		{`{"domain":"edge","hits_addend":4,"descriptors":[{"entries":[{"key":"tenant","value":"a"}]}]}`, 200, `"limitRemaining":2`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"a"}],"hitsAddend":"0"}]}`, 200, `"limitRemaining":2`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"a"}],"hits_addend":2,"isNegativeHits":true}]}`, 200, `"limitRemaining":4`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"a"}],"hits_addend":1,"is_negative_hits":true}]}`, 200, `"limitRemaining":5`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"b"}],"limit":{"requestsPerUnit":1,"unit":"HOUR"}}]}`, 200, `"currentLimit":{"requestsPerUnit":1,"unit":"HOUR"},"durationUntilReset":"2370s"`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"b"}],"limit":{"requests_per_unit":1,"unit":3}}]}`, 429, `"overallCode":"OVER_LIMIT"`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"c"}]}]}`, 200, `"responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"10"},{"key":"RateLimit-Remaining","value":"9"},{"key":"RateLimit-Reset","value":"30"}]`},
		{`{"domain":"nowhere","descriptors":[{"entries":[{"key":"k"}]}]}`, 200, `{"overallCode":"OK","statuses":[{"code":"OK"}]}`},
		// errors
		{`{"domain":"edge","descriptors":[]}`, 400, "descriptor list must not be empty"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":""}]}]}`, 400, "descriptors[0].entries[0].key is empty"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":-1}]}`, 400, "not an unsigned integer"},
		{`{"domain":"edge","hitsAddend":4294967296,"descriptors":[{"entries":[{"key":"k"}]}]}`, 400, "out of range for a uint32"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":4294967296}]}`, 400, "more than 4294967295"},
		{`{"domain":"edge","hitsAddend":1,"hits_addend":1,"descriptors":[{"entries":[{"key":"k"}]}]}`, 400, "given twice"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"limit":{"unit":"FORTNIGHT"}}]}`, 400, "not a RateLimitUnit"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"limit":{"unit":"UNKNOWN"}}]}`, 400, "limit.unit 0 is not a unit"},
		{`{"domain":"edge","surprise":1}`, 400, "unknown field"},
		// names exactly as protojson reads them, once each, in UTF-8 (the
		// gRPC endpoint's answers), and no WEEK in a request
		{`{"DOMAIN":"edge","descriptors":[{"entries":[{"key":"k"}]}]}`, 400, `unknown field "DOMAIN"`},
		{`{"domain":"edge","hitsaddend":1,"descriptors":[{"entries":[{"key":"k"}]}]}`, 400, `unknown field "hitsaddend"`},
		{`{"domain":"edge","domain":"other","descriptors":[{"entries":[{"key":"k"}]}]}`, 400, `field "domain" given twice`},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k","key":"j"}]}]}`, 400, `field "key" given twice`},
		{"{\"domain\":\"edge\",\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"value\":\"\xff\"}]}]}", 400, "not UTF-8"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":1,"unit":"WEEK"}}]}`, 400, "limit.unit 7 is not a unit of requests"},
		{`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":1,"unit":7}}]}`, 400, "limit.unit 7 is not a unit of requests"},
		{`{"domain":"edge"} {}`, 400, "data after the JSON object"},
		{`not json`, 400, "not a RateLimitRequest"},
		{`{"domain":"` + strings.Repeat("x", 2000) + `"}`, 413, "over 1024 bytes"},
	} {
		rec := do(http.MethodPost, tc.body)
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%.80s: %d %s\n\twant %d and %q", tc.body, rec.Code, rec.Body.String(), tc.code, tc.want)
		}
		if rec.Code < 300 && rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%.80s: content type %q", tc.body, rec.Header().Get("Content-Type"))
		}
	}
	if rec := do(http.MethodGet, ""); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "POST" {
		t.Errorf("GET: %d %v", rec.Code, rec.Header())
	}
	// 503 for ErrUnavailable.
	h.Service = serviceFunc(func(context.Context, *Request) (*Response, error) { return nil, ErrUnavailable })
	if rec := do(http.MethodPost, `{"domain":"edge","descriptors":[{"entries":[{"key":"k"}]}]}`); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("unavailable: %d", rec.Code)
	}
}

type serviceFunc func(context.Context, *Request) (*Response, error)

func (f serviceFunc) ShouldRateLimit(ctx context.Context, r *Request) (*Response, error) {
	return f(ctx, r)
}

func TestProtoJSONDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{
		59 * time.Second: "59s", 250 * time.Millisecond: "0.250s", 1500 * time.Microsecond: "0.001500s", time.Nanosecond: "0.000000001s",
	} {
		if got := protoDuration(d); got != want {
			t.Errorf("%v: %s, want %s", d, got, want)
		}
	}
	out := EncodeResponse(&Response{Overall: CodeOverLimit, Statuses: []Status{{Code: CodeOK, Limit: &Limit{Name: "n", RequestsPerUnit: 5, Unit: Week}}}})
	if !json.Valid(out) || !bytes.Contains(out, []byte(`"currentLimit":{"requestsPerUnit":5,"unit":"WEEK","name":"n"}`)) {
		t.Errorf("%s", out)
	}
}
