package serve

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/proxy"
)

// nginxPolicy has rate gates of every answer: a token bucket per tenant
// (429, exact Retry-After), a window per tenant on analytics (429), and a
// reservation of capacity (503 once the shared pool is spent), with
// required tenants and cost headers (400 when malformed).
const nginxPolicy = `version: 1
service: nginx-test
identity:
  tenant: {header: X-Api-Key, required: true}
  deadline: {header: X-Request-Timeout, max: 30s}
routes:
  - {match: {method: POST, path: /v1/routes}, class: critical, cost: {header: X-Stops, per: 100, min: 1, max: 50}}
  - {match: {path: "/v1/analytics/*"}, class: sheddable}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/s, burst: 3}
  - {name: analytics-window, kind: fixed_window, scope: tenant, classes: [sheddable], limit: 2, window: 10s}
  - {name: capacity, kind: reservation, capacity: 6, burst: 1s, shares: {critical: {reserve: 2}, default: {reserve: 4}}}
`

// vstep is one request of the shared vector: the clock moves by advance
// first (on both sides alike).
type vstep struct {
	advance time.Duration
	method  string
	uri     string
	header  map[string]string
}

func hdr(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// nginxVector: tenants a, b, c, d on a clock that moves only between steps.
var nginxVector = []vstep{
	{method: "GET", uri: "/v1/routes/1", header: hdr("X-Api-Key", "a")},
	{method: "GET", uri: "/v1/routes/2?full=1", header: hdr("X-Api-Key", "a")},
	{method: "POST", uri: "/v1/routes", header: hdr("X-Api-Key", "a", "X-Stops", "100")},
	{method: "GET", uri: "/v1/routes/3", header: hdr("X-Api-Key", "a")}, // a's bucket is empty
	{method: "GET", uri: "/v1/routes/3", header: hdr("X-Api-Key", "b")},
	{method: "GET", uri: "/v1/routes/3", header: hdr("X-Api-Key", "c")},
	{method: "GET", uri: "/v1/routes/3", header: hdr("X-Api-Key", "d")},
	{method: "GET", uri: "/v1/routes/4", header: hdr("X-Api-Key", "d")},
	{method: "GET", uri: "/v1/routes/4", header: hdr()},                                // no tenant: 400
	{method: "POST", uri: "/v1/routes", header: hdr("X-Api-Key", "b", "X-Stops", "x")}, // 400
	{advance: 1500 * time.Millisecond, method: "GET", uri: "/V1/Routes/5/", header: hdr("X-Api-Key", "a")},
	{method: "POST", uri: "/v1/routes", header: hdr("X-Api-Key", "b", "X-Stops", "250")},
	{method: "POST", uri: "/v1/routes", header: hdr("X-Api-Key", "c", "X-Stops", "9999")}, // cost 50 above every burst
	{advance: 3 * time.Second, method: "GET", uri: "/v1/analytics/daily", header: hdr("X-Api-Key", "c")},
	{method: "GET", uri: "/v1/analytics/daily", header: hdr("X-Api-Key", "c")},
	{method: "GET", uri: "/v1/analytics/weekly", header: hdr("X-Api-Key", "c")},
	{method: "GET", uri: "/v1/analytics/daily", header: hdr("X-Api-Key", "d", "X-Request-Timeout", "2s")},
	{method: "GET", uri: "/v1/analytics/daily", header: hdr("X-Api-Key", "d", "X-Request-Timeout", "later")},
	{advance: 10 * time.Second, method: "GET", uri: "/v1/analytics/daily", header: hdr("X-Api-Key", "c")},
	{method: "DELETE", uri: "/v1/routes/1", header: hdr("X-Api-Key", "b")},
	{method: "HEAD", uri: "/v1/routes/1", header: hdr("X-Api-Key", "b")},
}

// seen is what a client sees of one answer: the status, sluice's fields,
// and the application's body when admitted.
type seen struct {
	status                          int
	retryAfter, rateLimit, rlPolicy string
	body                            string
}

func (s seen) String() string {
	return fmt.Sprintf("%d Retry-After=%q RateLimit=%q RateLimit-Policy=%q body=%q", s.status, s.retryAfter, s.rateLimit, s.rlPolicy, s.body)
}

func send(t *testing.T, c *http.Client, base string, s vstep) seen {
	t.Helper()
	req, err := http.NewRequest(s.method, base+s.uri, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range s.header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := seen{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), rateLimit: resp.Header.Get("RateLimit"),
		rlPolicy: resp.Header.Get("RateLimit-Policy")}
	if resp.StatusCode < 300 {
		got.body = string(b)
	}
	return got
}

// nginx with auth_request to sluice serve (the example's sluice.conf)
// admits and refuses, request for request, what sluice proxy does with the
// same policy: same statuses, same Retry-After and RateLimit fields at the
// client, the application's own answer when admitted. Both sides decide on
// fake clocks moved alike between requests, so the vector is exact
// however slow the machine. With sluice gone, nginx refuses (503).
func TestNginxDecidesAsTheProxy(t *testing.T) {
	site, err := os.ReadFile("../examples/nginx/sluice.conf")
	if err != nil {
		t.Fatal(err)
	}
	nginxBinary(t) // skip before starting anything
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "app "+r.Method+" "+r.URL.RequestURI())
	}))
	defer app.Close()
	appURL, _ := url.Parse(app.URL)
	exact := &sluice.Jitter{}

	pclk, sclk := fakeclock.New(1), fakeclock.New(1)
	px, err := proxy.New(proxy.Options{Config: "p.yaml", ConfigData: []byte(nginxPolicy), Upstream: appURL, AdminToken: "x",
		Logger: quiet(), Clock: pclk, Jitter: exact})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	pxSrv := httptest.NewServer(px.Handler())
	defer pxSrv.Close()

	sv, err := New(Options{Config: "p.yaml", ConfigData: []byte(nginxPolicy), AdminToken: "x", Logger: quiet(), Clock: sclk, Jitter: exact})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	svSrv := httptest.NewServer(sv.Handler())
	defer svSrv.Close()

	ng := startNginx(t, string(site), svSrv.Listener.Addr().String(), app.Listener.Addr().String(), "")
	defer ng.stop()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	count := map[int]int{}
	for i, s := range nginxVector {
		pclk.Advance(s.advance)
		sclk.Advance(s.advance)
		want := send(t, client, pxSrv.URL, s)
		got := send(t, client, "http://"+ng.addr, s)
		if got != want {
			t.Errorf("step %d %s %s %v:\n  nginx+serve %v\n  proxy       %v", i, s.method, s.uri, s.header, got, want)
		}
		if testing.Verbose() {
			t.Logf("step %d: %v", i, want)
		}
		count[want.status]++
	}
	if count[200] < 6 || count[429] < 3 || count[503] < 1 || count[400] < 3 {
		t.Errorf("the vector does not exercise every answer: %v", count)
	}
	if t.Failed() {
		t.Logf("nginx error log:\n%s", ng.errorLog())
		return
	}

	// sluice gone: the example fails closed.
	svSrv.Close()
	if got := send(t, client, "http://"+ng.addr, nginxVector[0]); got.status != 503 || got.retryAfter != "" {
		t.Fatalf("sluice unreachable: %v", got)
	}
	ng.stop()
	if ng.waitErr != nil { // read after stop: it waited for the exit
		t.Errorf("nginx did not exit cleanly on SIGQUIT: %v", ng.waitErr)
	}
	if _, err := os.Stat(ng.dir + "/nginx.pid"); !os.IsNotExist(err) {
		t.Errorf("nginx left its pid file: %v", err)
	}
	// What nginx logs for each refusal: auth_request's view of it.
	if log := ng.errorLog(); !strings.Contains(log, "auth request unexpected status: 429") {
		t.Errorf("nginx error log:\n%s", log)
	}
}
