package whatif

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// syntheticLog is n access lines of sluice's JSON log: 1,000 tenants, a
// request every 100 µs, a tenth of them refused, the rest served by 20
// workers in 1 ms, one in ten (at random) in 10 ms: 86% busy, and some
// wait.
func syntheticLog(n int) []byte {
	var b bytes.Buffer
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	free := make([]time.Duration, 20) // when each worker is free, from t0
	rg := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		arrive := time.Duration(i) * 100 * time.Microsecond
		at := t0.Add(arrive).Format(time.RFC3339Nano)
		tenant := fmt.Sprintf("t-%012x", i%1000)
		if i%10 == 0 {
			fmt.Fprintf(&b, `{"time":%q,"level":"INFO","msg":"request","decision":"rejected","method":"GET","path":"/v1/routes/42","status":429,"reason":"policy_rate","gate":"tenant-rate","scope":"tenant","request_id":"a-%d","remote":"192.0.2.1:4000","class":"default","operation":"GET /v1/routes/*","cost":1,"tenant":%q}`+"\n", at, i, tenant)
			continue
		}
		w := slices.Index(free, slices.Min(free))
		service := time.Millisecond
		if rg.IntN(10) == 0 {
			service = 10 * time.Millisecond
		}
		free[w] = max(free[w], arrive) + service
		// The line is written when the request ends.
		fmt.Fprintf(&b, `{"time":%q,"level":"INFO","msg":"request","decision":"admitted","method":"GET","path":"/v1/routes/42","status":200,"duration":%d,"remote":"192.0.2.1:4000","class":"default","operation":"GET /v1/routes/*","cost":1,"tenant":%q}`+"\n", t0.Add(free[w]).Format(time.RFC3339Nano), free[w]-arrive, tenant)
	}
	return b.Bytes()
}

// BenchmarkWhatif reads and replays 100,000 lines (ten seconds of traffic
// at 10,000 requests/s) through a token bucket per tenant and a fixed
// window, with the upstream fitted and modeled: lines/min is the
// throughput.
func BenchmarkWhatif(b *testing.B) {
	const n = 100_000
	data := syntheticLog(n)
	cand := mustPolicy(b, "candidate.yaml", policyText("5/s"))
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		recs, _, err := Read(bytes.NewReader(data), ReadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		rep, err := Replay(recs, Options{Candidate: cand})
		if err != nil {
			b.Fatal(err)
		}
		if !strings.Contains(strings.Join(rep.Notes, " "), "modeled as") {
			b.Fatalf("no upstream model: %q", rep.Notes)
		}
	}
	b.ReportMetric(float64(n*b.N)/time.Since(start).Minutes(), "lines/min")
}
