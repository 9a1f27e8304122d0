package host

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leakcheck"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }

const livePolicy = `version: 1
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: "/a/*"}, class: sheddable}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 3}
  - {name: ladder, kind: ladder, workers: 4}
  - {name: pool, kind: concurrency, limit: 5, queue: {max_wait: 50ms}}
`

func newLiveHost(t *testing.T) (*Host, http.Handler, http.Handler) {
	t.Helper()
	h, err := New(Options{Config: "live.yaml", ConfigData: []byte(livePolicy), Clock: fakeclock.New(1),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	app := h.Middleware().Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return h, app, h.AdminHandler("secret")
}

func get(t *testing.T, h http.Handler, target string, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	return serve(h, httptest.NewRequest("GET", target, nil), header)
}

// serve sends r with header to h and returns the answer.
func serve(h http.Handler, r *http.Request, header map[string]string) *httptest.ResponseRecorder {
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// What /v1/live says is what the counters say: the same requests, read
// both ways, and the flooding tenant /metrics folds into "other" named.
func TestLiveCountsTheDecisions(t *testing.T) {
	_, app, admin := newLiveHost(t)
	for range 20 {
		get(t, app, "/x", map[string]string{"X-Api-Key": "sk_heavy"}) // 3 admitted, 17 rejected
	}
	for range 2 {
		get(t, app, "/a/y", map[string]string{"X-Api-Key": "sk_light"})
	}
	w := get(t, admin, "/v1/live?n=5", nil)
	if w.Code != 200 || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	if strings.Contains(w.Body.String(), "sk_") {
		t.Fatalf("a tenant key is visible:\n%s", w.Body)
	}
	var got live
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Classes) != 2 || len(got.Tenants.Rejected.Tenants) != 1 || len(got.Tenants.Consumed.Tenants) != 2 || len(got.Gates) != 3 {
		t.Fatalf("%s", w.Body)
	}
	def, shed, rej, con := got.Classes[0], got.Classes[1], got.Tenants.Rejected, got.Tenants.Consumed
	heavy := metrics.HashTenant("sk_heavy")
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"classes", def.Class + " " + shed.Class, "default sheddable"},
		{"default offered, admitted", [2]int64{def.Offered, def.Admitted}, [2]int64{20, 3}},
		{"default rejected", def.Rejected, map[string]int64{"policy_rate": 17}},
		{"default useful, consumed", [2]int64{def.Completed["useful"], def.Units["consumed"]}, [2]int64{3, 3}},
		{"sheddable admitted", shed.Admitted, int64(2)},
		{"totals", got.Totals, map[string]int64{"offered": 22, "admitted": 5, "rejected": 17, "useful": 5, "consumed_units": 5, "inflight": 0}},
		{"rejected total, capacity", [2]int64{rej.Total, int64(rej.Capacity)}, [2]int64{17, metrics.DefaultTopTenants}},
		{"rejected most", rej.Tenants[0], metrics.TenantCount{Tenant: heavy, Count: 17, By: map[string]int64{"policy_rate": 17}}},
		{"consumed most", [3]any{con.Total, con.Tenants[0].Tenant, con.Tenants[0].Count}, [3]any{int64(5), heavy, int64(3)}},
		{"gates", fmt.Sprint(got.Gates[0].Name, got.Gates[0].Mode, got.Gates[1].Name, got.Gates[2].Name), "request-rateenforceladderpool"},
		{"ladder level", got.Gates[1].Level, "normal"},
		{"pool queue", got.Gates[2].Queue != nil, true},
		{"store failures", got.Gates[0].Failures != nil && got.Gates[0].FailurePolicy != "", true},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if strings.Contains(w.Body.String(), `"limit":3`) {
		t.Fatal("/v1/live shows a quota, which /v1/gates keeps behind the token")
	}
}

func TestLiveListsAtMostNTenants(t *testing.T) {
	_, app, admin := newLiveHost(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		for range 5 {
			get(t, app, "/x", map[string]string{"X-Api-Key": k})
		}
	}
	var got live
	json.Unmarshal(get(t, admin, "/v1/live?n=2", nil).Body.Bytes(), &got)
	if len(got.Tenants.Rejected.Tenants) != 2 || got.Tenants.Rejected.Total != 8 {
		t.Fatalf("%+v", got.Tenants.Rejected)
	}
	for _, q := range []string{"n=0", "n=-1", "n=abc", "n=65", "n=1e3"} {
		w := get(t, admin, "/v1/live?"+q, nil)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "n: want") {
			t.Errorf("%s: %d %s", q, w.Code, w.Body)
		}
	}
}

// The page and its assets come from the binary, under a policy that lets
// them load nothing from anywhere else.
func TestLivePageIsEmbeddedAndSelfContained(t *testing.T) {
	_, _, admin := newLiveHost(t)
	if w := get(t, admin, "/", nil); w.Code != http.StatusFound || w.Header().Get("Location") != "/live/" {
		t.Fatalf("/: %d %v", w.Code, w.Header())
	}
	for path, ctype := range map[string]string{"/live/": "text/html", "/live/live.js": "text/javascript", "/live/live.css": "text/css"} {
		w := get(t, admin, path, nil)
		if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), ctype) || w.Header().Get("Content-Security-Policy") != liveCSP {
			t.Fatalf("%s: %d %v", path, w.Code, w.Header())
		}
	}
	if w := get(t, admin, "/live/nope.js", nil); w.Code != 404 {
		t.Fatalf("a missing asset: %d", w.Code)
	}
	// No address outside the admin listener in any asset (the SVG
	// namespace names, it does not load).
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	fs.WalkDir(liveFiles, "live", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := liveFiles.ReadFile(path)
		for _, m := range external.FindAllString(string(b), -1) {
			if m != "http://www.w3.org" {
				t.Errorf("%s refers to %s", path, m)
			}
		}
		return nil
	})
	if w := get(t, admin, "/v1/gates", nil); w.Code != 401 {
		t.Fatalf("/v1/gates without the token: %d", w.Code)
	}
}

// Any query of /v1/live is answered 200 with JSON or 400, never a panic.
func FuzzLiveQuery(f *testing.F) {
	for _, s := range []string{"n=3", "n=", "n=0", "n=99999999999999999999", "n=%zz", "n=1&n=2", ";", "n=\x00"} {
		f.Add(s)
	}
	h, err := New(Options{Config: "live.yaml", ConfigData: []byte(livePolicy), Clock: fakeclock.New(1),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	defer h.Close()
	admin := h.AdminHandler("secret")
	f.Fuzz(func(t *testing.T, q string) {
		r := httptest.NewRequest("GET", "/v1/live", nil)
		r.URL.RawQuery = q
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, r)
		if w.Code != 200 && w.Code != 400 {
			t.Fatalf("%q: %d", q, w.Code)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%q: not JSON: %s", q, w.Body)
		}
		if n, err := url.ParseQuery(q); err == nil && w.Code == 200 && n.Get("n") != "" {
			var got live
			json.Unmarshal(w.Body.Bytes(), &got)
			if len(got.Tenants.Rejected.Tenants) > metrics.DefaultTopTenants {
				t.Fatalf("%q: %d tenants", q, len(got.Tenants.Rejected.Tenants))
			}
		}
	})
}

// Before any traffic, /v1/live reads as lists the page can walk: no null
// where it expects an array.
func TestLiveBeforeAnyTraffic(t *testing.T) {
	_, _, admin := newLiveHost(t)
	body := get(t, admin, "/v1/live", nil).Body.String()
	for _, want := range []string{`"classes":[]`, `"gates":[{`, `"tenants":[]`} {
		if !strings.Contains(body, want) {
			t.Errorf("/v1/live lacks %s:\n%s", want, body)
		}
	}
}

// /v1/gates shows each gate's kind, and a bucket in the policy's own terms
// (rate and burst) beside its quota over the time it takes to fill.
func TestGatesShowBucketsAsRateAndBurst(t *testing.T) {
	_, _, admin := newLiveHost(t)
	w := get(t, admin, "/v1/gates", map[string]string{"Authorization": "Bearer secret"})
	var gates []gateState
	if err := json.Unmarshal(w.Body.Bytes(), &gates); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	want := map[string]gateState{
		"request-rate": {Name: "request-rate", Kind: "token_bucket", Mode: "enforce", Limit: 3, WindowSeconds: 3 * 3600,
			RatePerSecond: 1.0 / 3600, Burst: 3, Unit: "requests"},
		"pool": {Name: "pool", Kind: "concurrency", Mode: "enforce", Limit: 5, Unit: "concurrent-requests"},
	}
	for _, g := range gates {
		if w, ok := want[g.Name]; ok {
			g.State = nil
			if g != w {
				t.Errorf("%+v, want %+v", g, w)
			}
			delete(want, g.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing: %v", want)
	}
}

func post(t *testing.T, h http.Handler, target, body string, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	return serve(h, httptest.NewRequest("POST", target, strings.NewReader(body)), header)
}

// With the admin token, a label gives the key of the tenant behind it (one
// the metrics hold: here a tenant only ever rejected, kept by the sketch,
// and one with a label slot) and a key gives its label; without it, or
// with a malformed or oversized body, nothing is answered.
func TestTenantLookup(t *testing.T) {
	_, app, admin := newLiveHost(t)
	for range 20 {
		get(t, app, "/x", map[string]string{"X-Api-Key": "sk_heavy"})
	}
	auth := map[string]string{"Authorization": "Bearer secret"}
	heavy := metrics.HashTenant("sk_heavy")
	w := post(t, admin, "/v1/tenants/lookup", `{"labels": ["`+heavy+`", "t-000000000000"], "keys": ["sk_heavy", "sk_never"]}`, auth)
	if w.Code != 200 || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
	var got struct{ Tenants []tenantLookup }
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []tenantLookup{
		{Label: heavy, Key: "sk_heavy", Known: true},
		{Label: "t-000000000000"},
		{Label: heavy, Key: "sk_heavy", Known: true},
		{Label: metrics.HashTenant("sk_never"), Key: "sk_never"},
	}
	if !reflect.DeepEqual(got.Tenants, want) {
		t.Fatalf("got %+v\nwant %+v", got.Tenants, want)
	}
	for _, c := range []struct {
		body   string
		header map[string]string
		code   int
	}{
		{`{"labels": ["` + heavy + `"]}`, nil, 401},
		{`{"labels": ["` + heavy + `"]}`, map[string]string{"Authorization": "Bearer wrong"}, 401},
		{`{"label": "x"}`, auth, 400},
		{`{"labels": []} {}`, auth, 400},
		{`{"labels": [` + strings.Repeat(`"t-0",`, 100) + `"t-0"]}`, auth, 400},
		{strings.Repeat(" ", 70<<10) + `{"labels": []}`, auth, 400},
	} {
		w := post(t, admin, "/v1/tenants/lookup", c.body, c.header)
		if w.Code != c.code || strings.Contains(w.Body.String(), "sk_heavy") {
			t.Errorf("%.40q: %d %s, want %d", c.body, w.Code, w.Body, c.code)
		}
	}
}

// The history keeps the last historyLen readings, oldest first, and serves
// them without the token; Close stops its readings.
func TestLiveHistory(t *testing.T) {
	var h history
	for i := range historyLen + 5 {
		h.add(live{Policy: fmt.Sprint(i)})
	}
	got := h.readings()
	if len(got) != historyLen || got[0].Policy != "5" || got[historyLen-1].Policy != fmt.Sprint(historyLen+4) {
		t.Fatalf("%d readings, from %s to %s", len(got), got[0].Policy, got[len(got)-1].Policy)
	}

	host, _, admin := newLiveHost(t) // AdminHandler took the first reading
	w := get(t, admin, "/v1/live/history", nil)
	var body struct{ Readings []live }
	if w.Code != 200 || w.Header().Get("Cache-Control") != "no-store" || json.Unmarshal(w.Body.Bytes(), &body) != nil || len(body.Readings) != 1 {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
	if body.Readings[0].Policy != host.Version() || len(body.Readings[0].Gates) != 3 {
		t.Errorf("reading %+v", body.Readings[0])
	}
	host.Close()
	host.Close() // twice: no panic
	var never history
	never.close()
	never.start(func() live { t.Fatal("a history closed before it started took a reading"); return live{} })
}
