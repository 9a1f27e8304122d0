package httpcore_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/store/memory"
)

// discard is a ResponseWriter that keeps nothing, so the benchmarks measure
// the middleware and not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

func benchMiddleware(b *testing.B, rate string, burst int64, al ...*httpcore.AccessLog) {
	r, _ := limit.ParseRate(rate)
	tb, _ := limit.NewTokenBucket(r, burst)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	cfg := httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: &sluice.DefaultJitter}
	if len(al) > 0 {
		cfg.AccessLog = al[0]
	}
	mw, _ := httpcore.New(chain, cfg)
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest("GET", "/v1/routes/42", nil)
	req.Header.Set("X-Api-Key", "tenant-42")
	w := &discard{h: http.Header{}}
	h.ServeHTTP(w, req)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.h)
		h.ServeHTTP(w, req)
	}
}

// BenchmarkRejected: the full rejection path (identify, decide, headers,
// JSON envelope) of a tenant over its limit.
func BenchmarkRejected(b *testing.B) { benchMiddleware(b, "1/h", 1) }

// BenchmarkRejectedAccessLog: the rejection path with the access log on
// (JSON lines, the default sample of one line a second per reason): past
// the sample, a rejection costs a clock read and a few atomic operations.
func BenchmarkRejectedAccessLog(b *testing.B) {
	benchMiddleware(b, "1/h", 1, &httpcore.AccessLog{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
}

// BenchmarkAdmittedNoop: an admitted request to a handler that does nothing.
func BenchmarkAdmittedNoop(b *testing.B) { benchMiddleware(b, "1e9/s", 1e9) }

// BenchmarkAdmittedNoopHTTP: an admitted request to a no-op handler as a
// service serves it: over a real loopback connection (keep-alive), through
// net/http's parsing and response writing and the middleware.
func BenchmarkAdmittedNoopHTTP(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	mw, _ := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}})
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	client := srv.Client()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/routes/42", nil)
	req.Header.Set("X-Api-Key", "tenant-42")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkDecideAdmitted: the decision endpoint's admitted answer in
// process (nginx's form: the original method and URI from headers, the
// URI parsed as a request line, identify, decide, release, the quota
// fields), next to BenchmarkAdmittedNoop.
func BenchmarkDecideAdmitted(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	mw, _ := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: &sluice.DefaultJitter})
	h, _ := mw.DecisionHandler(httpcore.DecisionConfig{})
	req := httptest.NewRequest("GET", "/v1/decide", nil)
	req.Header.Set("X-Api-Key", "tenant-42")
	req.Header.Set("X-Original-Method", "GET")
	req.Header.Set("X-Original-URI", "/v1/routes/42?full=1")
	w := &discard{h: http.Header{}}
	h.ServeHTTP(w, req)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.h)
		h.ServeHTTP(w, req)
	}
}

// BenchmarkRejectedMetrics: BenchmarkRejected with the Prometheus metrics
// observing every decision (as sluice proxy and sluice serve run them):
// the counters by class and tenant, the decision histogram, and the
// heaviest tenants kept for the live page.
func BenchmarkRejectedMetrics(b *testing.B) { benchMetrics(b, "1/h", 1, 1) }

// BenchmarkRejectedMetricsManyTenants: the same with 4,096 tenants in turn,
// every one over its limit: the worst case of the tenant top-N, where most
// rejections are of a tenant it does not hold.
func BenchmarkRejectedMetricsManyTenants(b *testing.B) { benchMetrics(b, "1/h", 1, 4096) }

// BenchmarkAdmittedNoopMetrics: BenchmarkAdmittedNoop with the metrics
// observing (the decision, and the completion whose units the top-N of
// consumers counts).
func BenchmarkAdmittedNoopMetrics(b *testing.B) { benchMetrics(b, "1e9/s", 1e9, 1) }

func benchMetrics(b *testing.B, rate string, burst int64, tenants int) {
	r, _ := limit.ParseRate(rate)
	tb, _ := limit.NewTokenBucket(r, burst)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Observer: metrics.New(metrics.Options{})}, g)
	mw, _ := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: &sluice.DefaultJitter})
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	reqs := make([]*http.Request, tenants)
	w := &discard{h: http.Header{}}
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/v1/routes/42", nil)
		reqs[i].Header.Set("X-Api-Key", fmt.Sprint("tenant-", i))
		h.ServeHTTP(w, reqs[i]) // spends a rejected tenant's one token
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.h)
		h.ServeHTTP(w, reqs[i%tenants])
	}
}
