package host

import (
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	r := httptest.NewRequest("GET", target, nil)
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
	if len(got.Classes) != 2 || got.Classes[0].Class != "default" || got.Classes[0].Offered != 20 || got.Classes[0].Admitted != 3 ||
		got.Classes[0].Rejected["policy_rate"] != 17 || got.Classes[0].Completed["useful"] != 3 || got.Classes[0].Units["consumed"] != 3 ||
		got.Classes[1].Class != "sheddable" || got.Classes[1].Admitted != 2 {
		t.Fatalf("classes %+v", got.Classes)
	}
	if got.Totals["offered"] != 22 || got.Totals["rejected"] != 17 || got.Totals["useful"] != 5 || got.Totals["consumed_units"] != 5 || got.Totals["inflight"] != 0 {
		t.Fatalf("totals %v", got.Totals)
	}
	rej := got.Tenants.Rejected
	if rej.Total != 17 || rej.Capacity != metrics.DefaultTopTenants || len(rej.Tenants) != 1 ||
		rej.Tenants[0].Tenant != metrics.HashTenant("sk_heavy") || rej.Tenants[0].Count != 17 || rej.Tenants[0].By["policy_rate"] != 17 {
		t.Fatalf("top rejected %+v", rej)
	}
	con := got.Tenants.Consumed
	if con.Total != 5 || len(con.Tenants) != 2 || con.Tenants[0].Tenant != metrics.HashTenant("sk_heavy") || con.Tenants[0].Count != 3 {
		t.Fatalf("top consumed %+v", con)
	}
	var names []string
	for _, g := range got.Gates {
		names = append(names, g.Name+":"+g.Mode)
	}
	if strings.Join(names, " ") != "request-rate:enforce ladder:enforce pool:enforce" {
		t.Fatalf("gates %v", names)
	}
	if got.Gates[1].Level != "normal" || got.Gates[2].Queue == nil || got.Gates[0].Failures == nil || got.Gates[0].FailurePolicy == "" {
		t.Fatalf("gate states %+v", got.Gates)
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
