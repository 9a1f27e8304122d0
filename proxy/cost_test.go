package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/redistest"
)

// The upstream answers the work's actual cost (X-Work-Units) and the
// tenant's budget is charged that, not the estimate: on the memory store
// and on Redis, with a token bucket and a GCRA, a tenant whose requests
// cost 10 units gets exactly a tenth of the requests of one whose cost 1
// (100 units, nothing refills during the test); one that declares 50 and
// spends 1 is refunded the 49, to the unit; an answer without the header,
// or with a malformed or repeated one, keeps the estimate.
func TestResponseCostTruesUpTheCharge(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for v := range strings.SplitSeq(r.Header.Get("X-Answer"), "|") {
			if v != "" {
				w.Header().Add("X-Work-Units", v) // "10|10": the field twice
			}
		}
	})
	var redisAddr string
	for _, store := range []string{"memory", "redis"} {
		for _, kind := range []string{"token_bucket, rate: 1/h", "gcra, rate: 1/h"} {
			storeLine := "{backend: memory}"
			if store == "redis" {
				if redisAddr == "" {
					redisAddr = redistest.Start(t).Addr
				}
				storeLine = "{backend: redis, addrs: [" + redisAddr + "], timeout: 2s}"
			}
			_, base := serve(t, fmt.Sprintf(`version: 1
service: cost-%s-%s
store: %s
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: /work}, cost: {response_header: X-Work-Units}}
  - {match: {path: /declared}, cost: {header: X-Units, response_header: X-Work-Units}}
gates:
  - {name: budget, kind: %s, scope: tenant, burst: 100}
`, store, strings.Fields(kind)[0][:2], storeLine, kind), up)
			admitted := func(tenant, path, declared, answer string) int {
				t.Helper()
				n := 0
				for range 200 {
					req, _ := http.NewRequest("GET", base+path, nil)
					req.Header.Set("X-Api-Key", tenant)
					if declared != "" {
						req.Header.Set("X-Units", declared)
					}
					if answer != "" {
						req.Header.Set("X-Answer", answer)
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						return n
					}
					n++
				}
				return n
			}
			what := store + " " + strings.TrimSuffix(strings.Fields(kind)[0], ",")
			if n := admitted("ten-"+store, "/work", "", "10"); n != 10 {
				t.Errorf("%s: work of 10 units, estimate 1: %d admitted of 100 units, want 10", what, n)
			}
			if n := admitted("one-"+store, "/work", "", "1"); n != 100 {
				t.Errorf("%s: work of 1 unit: %d admitted, want 100", what, n)
			}
			// Each needs its estimate at admission and gets 49 back: the
			// k-th finds 101 − k units, so 51 pass and 49 units are left,
			// exactly what one more declaring 49 takes.
			if n := admitted("refund-"+store, "/declared", "50", "1"); n != 51 {
				t.Errorf("%s: declared 50, spent 1: %d admitted, want 51 (49 refunded each)", what, n)
			}
			if n := admitted("refund-"+store, "/declared", "49", "49"); n != 1 {
				t.Errorf("%s: after the refunds, %d requests of 49 admitted, want 1 (49 units left)", what, n)
			}
			if n := admitted("none-"+store, "/work", "", ""); n != 100 {
				t.Errorf("%s: no answer header: %d admitted, want 100 (the estimate of 1)", what, n)
			}
			if n := admitted("bad-"+store, "/work", "", "ten"); n != 100 {
				t.Errorf("%s: a malformed answer header: %d admitted, want 100 (the estimate)", what, n)
			}
			if n := admitted("twice-"+store, "/work", "", "10|10"); n != 100 {
				t.Errorf("%s: the answer's cost field twice: %d admitted, want 100 (malformed: the estimate)", what, n)
			}
		}
	}
}
