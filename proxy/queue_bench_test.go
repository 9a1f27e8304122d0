package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"
)

// oneWorker is an upstream with a single worker of fixed service time
// behind an unbounded queue (goroutines waiting on a mutex), as a naive
// service is.
func oneWorker(service time.Duration) *httptest.Server {
	var worker sync.Mutex
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		worker.Lock()
		time.Sleep(service)
		worker.Unlock()
	}))
}

// openLoop sends rate requests per second to target for d, each at its
// scheduled instant whatever the earlier ones are doing (open loop), and
// returns the latencies of the 200s and the count of the others.
func openLoop(target string, rate int, d time.Duration) (ok []time.Duration, rejected int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	n := int(float64(rate) * d.Seconds())
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := client.Get(target + "/work")
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rejected++
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ok = append(ok, lat)
			} else {
				rejected++
			}
		}()
	}
	wg.Wait()
	return ok, rejected
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// BenchmarkBoundedQueue is the bounded-queue experiment over loopback: one
// worker of 6 ms (capacity ≈ 166/s) under 300 requests/s, open loop, for
// 1.5 s; straight to the upstream's unbounded queue, and through sluice
// proxy with one slot and a queue bounded at 90 ms of waiting (15 × 6 ms).
// It reports, per run, accepted and rejected requests and the p50, p99 and
// max latency of the accepted ones. Run it once:
//
//	go test -run '^$' -bench BoundedQueue -benchtime 1x ./proxy
func BenchmarkBoundedQueue(b *testing.B) {
	const service, rate, length = 6 * time.Millisecond, 300, 1500 * time.Millisecond
	for range b.N {
		up := oneWorker(service)
		direct, rejD := openLoop(up.URL, rate, length)
		u, _ := url.Parse(up.URL)
		s, err := New(Options{Config: "p.yaml", ConfigData: []byte(`version: 1
gates:
  - {name: worker, kind: concurrency, limit: 1, queue: {max_wait: 90ms}}
`), Upstream: u, AdminToken: "x", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		px := httptest.NewServer(s.Handler())
		bounded, rejB := openLoop(px.URL, rate, length)
		px.Close()
		s.host.Close()
		up.Close()
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(float64(len(direct)), "unbounded-accepted")
		b.ReportMetric(float64(rejD), "unbounded-rejected")
		b.ReportMetric(ms(quantile(direct, 0.5)), "unbounded-p50-ms")
		b.ReportMetric(ms(quantile(direct, 0.99)), "unbounded-p99-ms")
		b.ReportMetric(ms(quantile(direct, 1)), "unbounded-max-ms")
		b.ReportMetric(float64(len(bounded)), "bounded-accepted")
		b.ReportMetric(float64(rejB), "bounded-rejected")
		b.ReportMetric(ms(quantile(bounded, 0.5)), "bounded-p50-ms")
		b.ReportMetric(ms(quantile(bounded, 0.99)), "bounded-p99-ms")
		b.ReportMetric(ms(quantile(bounded, 1)), "bounded-max-ms")
	}
}
