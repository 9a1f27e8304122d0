package client

import (
	"net/http"
	"testing"
	"time"
)

// A thousand clients all refused at the same instant with the same
// "Retry-After: 3" (a server that does not spread its answers) come back
// spread: no 100 ms slot receives more than 5% of the retries, and none
// comes back before the 3 s the server asked for.
func TestThousandClientsSpreadRetries(t *testing.T) {
	const clients = 1000
	slots := map[time.Duration]int{}
	for i := range clients {
		f := newFake()
		base := newScripted(f, func(n int, _ *http.Request) (*http.Response, error) {
			if n == 0 {
				return reply(429, map[string]string{"Retry-After": "3"}, ""), nil
			}
			return reply(200, nil, "ok"), nil
		})
		r := f.retrier(t, uint64(i)+1, Options{})
		req, _ := http.NewRequest("GET", "http://svc/x", nil)
		resp, err := (&Transport{Retrier: r, Base: base}).RoundTrip(req)
		if err != nil || resp.StatusCode != 200 || len(base.at) != 2 {
			t.Fatalf("client %d: %v %v after %d attempts", i, resp, err, len(base.at))
		}
		resp.Body.Close()
		back := base.at[1]
		if back < 3*time.Second {
			t.Fatalf("client %d retried after %v, before the Retry-After", i, back)
		}
		slots[back/(100*time.Millisecond)]++
	}
	most := 0
	for _, n := range slots {
		most = max(most, n)
	}
	t.Logf("%d retries over %d slots of 100 ms, at most %d in one", clients, len(slots), most)
	if most > clients*5/100 {
		t.Fatalf("%d of %d retries in one 100 ms slot (want ≤ 5%%)", most, clients)
	}
}
