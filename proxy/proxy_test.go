package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/leakcheck"
	"github.com/sluice-go/sluice/internal/logbuf"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.Ignore()...)
}

const policyV1 = `version: 1
service: test
identity:
  tenant: {header: X-Api-Key}
routes:
  - {match: {path: "/slow/*"}, class: default}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/s, burst: 3}
  - {name: pool, kind: concurrency, scope: service, limit: 5}
`

type harness struct {
	t       *testing.T
	s       *Server
	ticks   chan time.Time // the reload watcher's ticks
	base    string
	admin   string
	file    string
	release chan struct{}
	entered chan struct{}
	probes  int
	log     logbuf.Buffer // the server's log
}

func newHarness(t *testing.T, policy string) *harness {
	t.Helper()
	h := &harness{t: t, release: make(chan struct{}), entered: make(chan struct{}, 100), ticks: make(chan time.Time)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			h.entered <- struct{}{}
			<-h.release
		}
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	h.file = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(h.file, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.URL)
	s, err := New(Options{
		Config: h.file, Upstream: u, Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		AdminToken: "secret", Ticks: h.ticks, Clock: fakeclock.New(1),
		Logger: slog.New(slog.NewTextHandler(&h.log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	p, a := s.Addrs()
	h.base, h.admin = "http://"+p.String(), "http://"+a.String()
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return h
}

func (h *harness) do(method, url, token, body string, hdr map[string]string) (*http.Response, string) {
	h.t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestProxyEnforcesPolicy(t *testing.T) {
	h := newHarness(t, policyV1)
	key := map[string]string{"X-Api-Key": "acme"}
	for i := range 3 {
		resp, body := h.do("GET", h.base+"/v1/x", "", "", key)
		if resp.StatusCode != 200 || body != "upstream /v1/x" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("RateLimit") == "" {
			t.Fatal("RateLimit fields missing on an admitted response")
		}
	}
	resp, body := h.do("GET", h.base+"/v1/x", "", "", key)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `"reason":"policy_rate"`) {
		t.Fatalf("4th: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// Service-wide pool of 5: the 6th concurrent request gets 503.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.do("GET", h.base+"/slow/"+string(rune('a'+i)), "", "", map[string]string{"X-Api-Key": "t" + string(rune('a'+i))})
		}()
	}
	for range 5 {
		<-h.entered
	}
	resp, body = h.do("GET", h.base+"/v1/y", "", "", map[string]string{"X-Api-Key": "other"})
	if resp.StatusCode != 503 || !strings.Contains(body, `"reason":"concurrency"`) || resp.Header.Get("Retry-After") != "1" && resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("pool full: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	close(h.release)
	wg.Wait()
	// Metrics saw it all.
	resp, body = h.do("GET", h.admin+"/metrics", "", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `sluice_requests_rejected_total{class="default",gate="pool",mode="enforce",reason="concurrency",tenant="other"} 1`) {
		t.Fatalf("metrics: %d\n%s", resp.StatusCode, grep(body, "sluice_requests_rejected"))
	}
	if !strings.Contains(body, `sluice_gate_store_failures_total{gate="request-rate",policy="fail_open"} 0`) {
		t.Fatalf("gate store failures not exported:\n%s", grep(body, "store_failures"))
	}
	if resp, _ := h.do("GET", h.admin+"/healthz", "", "", nil); resp.StatusCode != 200 {
		t.Fatal("healthz")
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHotReloadKeepsInFlightAndState(t *testing.T) {
	h := newHarness(t, policyV1)
	key := map[string]string{"X-Api-Key": "acme"}
	for range 3 {
		h.do("GET", h.base+"/v1/x", "", "", key) // acme's bucket is now empty
	}
	codes := make(chan int, 4)
	for i := range 4 {
		go func() {
			resp, _ := h.do("GET", h.base+"/slow/"+string(rune('a'+i)), "", "", map[string]string{"X-Api-Key": "t" + string(rune('a'+i))})
			codes <- resp.StatusCode
		}()
	}
	for range 4 {
		<-h.entered
	}
	// New policy: the pool grows; request-rate is unchanged.
	if err := os.WriteFile(h.file, []byte(strings.Replace(policyV1, "limit: 5", "limit: 50", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := h.s.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	close(h.release)
	for range 4 {
		if c := <-codes; c != 200 {
			t.Fatalf("an in-flight request got %d across the reload", c)
		}
	}
	if resp, _ := h.do("GET", h.base+"/v1/x", "", "", key); resp.StatusCode != 429 {
		t.Fatalf("unchanged gate lost its state on reload: %d", resp.StatusCode)
	}
	for _, g := range h.s.Chain().Gates() {
		if a, ok := sluice.As[sluice.Advertiser](g); ok && g.Name() == "pool" && a.Policy().Quota != 50 {
			t.Fatalf("new policy not serving: %+v", a.Policy())
		}
	}
}

// poll makes the reload watcher check the file n times and returns once it
// has acted on each (it takes a tick only when done with the one before, so
// the extra tick sent last proves the n-th handled; it is one check more).
func (h *harness) poll(n int) {
	for range n + 1 {
		h.ticks <- time.Time{}
	}
}

// replace writes content to a new file and renames it over the policy
// file: the atomic replacement the watcher reloads.
func (h *harness) replace(content string) {
	h.t.Helper()
	tmp := h.file + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.file); err != nil {
		h.t.Fatal(err)
	}
}

// A file written in place is never loaded by the watcher, however long its
// writer pauses: before, a write that stalled 2 s mid-file loaded a
// truncated but valid policy (3 gates, then 1, then 3, with fresh state).
// Here the first half (a valid policy with one gate) stays on disk across
// many checks, then the second half follows: the chain never had one gate.
// SIGHUP (Reload) loads what is there; an atomic replacement reloads by
// itself.
func TestHalfWrittenFileNeverLoads(t *testing.T) {
	const full = policyV1 + "  - {name: second, kind: concurrency, scope: tenant, limit: 7}\n  - {name: third, kind: concurrency, limit: 50}\n"
	h := newHarness(t, full)
	gates := len(h.s.Chain().Gates())
	half := strings.SplitAfter(full, "scope: tenant, limit: 7}\n")[0] // ends before the third gate: valid on its own
	f, err := os.OpenFile(h.file, os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(half)
	h.poll(10) // the writer pauses (for any length of time)
	if n := len(h.s.Chain().Gates()); n != gates {
		t.Fatalf("a half-written file was loaded: %d gates of %d", n, gates)
	}
	f.WriteString(strings.TrimPrefix(full, half))
	f.Close()
	h.poll(3)
	if n := len(h.s.Chain().Gates()); n != gates {
		t.Fatalf("%d gates of %d after the write completed", n, gates)
	}
	// An in-place change loads on SIGHUP.
	os.WriteFile(h.file, []byte(strings.Replace(full, "limit: 50", "limit: 60", 1)), 0o644)
	h.poll(3)
	if p := h.policyOf("third"); p.Quota != 50 {
		t.Fatalf("an in-place change was loaded by the watcher: %+v", p)
	}
	if changed, err := h.s.Reload(); !changed || err != nil {
		t.Fatal(changed, err)
	}
	if p := h.policyOf("third"); p.Quota != 60 {
		t.Fatalf("SIGHUP did not load the file: %+v", p)
	}
	// A policy without gates is refused on reload: every limit off at once.
	h.replace("version: 1\ngates: []\n")
	h.poll(3)
	if n := len(h.s.Chain().Gates()); n != gates {
		t.Fatalf("a policy with no gates replaced the serving one: %d gates", n)
	}
	// The refused file, now written in place, is not loaded either: it
	// was (half a policy, one gate, loaded as if it had replaced the file).
	os.WriteFile(h.file, []byte(half), 0o644)
	h.poll(5)
	if n := len(h.s.Chain().Gates()); n != gates {
		t.Fatalf("an in-place write to a refused file was loaded: %d gates of %d", n, gates)
	}
	os.WriteFile(h.file, []byte(full), 0o644)
	if changed, err := h.s.Reload(); !changed || err != nil {
		t.Fatal(changed, err)
	}
	// And a replacement after it reloads by itself.
	h.replace(strings.Replace(full, "limit: 50", "limit: 70", 1))
	h.poll(3)
	if p := h.policyOf("third"); p.Quota != 70 {
		t.Fatalf("an atomic replacement after SIGHUP was not loaded: %+v", p)
	}
}

// policyOf returns the quota of gate name, advertised or not.
func (h *harness) policyOf(name string) sluice.Policy {
	for _, g := range h.s.Chain().Gates() {
		if a, ok := sluice.As[sluice.Advertiser](g); ok && g.Name() == name {
			return a.Policy()
		}
	}
	return sluice.Policy{}
}

func TestInvalidReloadIsRefused(t *testing.T) {
	h := newHarness(t, policyV1)
	before := h.s.Chain()
	os.WriteFile(h.file, []byte(strings.Replace(policyV1, "rate: 1/s", "rate: 1/x", 1)), 0o644)
	h.poll(3)
	if h.s.Chain() != before {
		t.Fatal("an invalid policy replaced the serving one")
	}
	if _, err := h.s.Reload(); err == nil || !strings.Contains(err.Error(), "policy.yaml:") {
		t.Fatalf("reload error does not name the file: %v", err)
	}
	if resp, _ := h.do("GET", h.base+"/v1/x", "", "", map[string]string{"X-Api-Key": "z"}); resp.StatusCode != 200 {
		t.Fatal("old policy stopped serving")
	}
	// A valid file renamed over the path is picked up by the watcher once
	// two reads agree.
	h.replace(strings.Replace(policyV1, "burst: 3", "burst: 4", 1))
	h.poll(2)
	if h.s.Chain() == before {
		t.Fatal("file change not reloaded")
	}
}

func TestAdminModeSwitch(t *testing.T) {
	h := newHarness(t, policyV1)
	if resp, _ := h.do("GET", h.admin+"/v1/gates", "", "", nil); resp.StatusCode != 401 {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	if resp, _ := h.do("POST", h.admin+"/v1/gates/request-rate", "wrong", `{"mode":"off"}`, nil); resp.StatusCode != 401 {
		t.Fatalf("wrong token: %d", resp.StatusCode)
	}
	resp, body := h.do("GET", h.admin+"/v1/gates", "secret", "", nil)
	var gates []struct {
		Name, Mode string
		Limit      int64
	}
	json.Unmarshal([]byte(body), &gates)
	if resp.StatusCode != 200 || len(gates) != 2 || gates[0].Name != "request-rate" || gates[0].Mode != "enforce" || gates[0].Limit != 3 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = h.do("POST", h.admin+"/v1/gates/request-rate", "secret", `{"mode":"shadow"}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"mode":"shadow"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	key := map[string]string{"X-Api-Key": "acme"}
	for i := range 10 {
		if resp, _ := h.do("GET", h.base+"/v1/x", "", "", key); resp.StatusCode != 200 {
			t.Fatalf("shadow mode rejected request %d", i)
		}
	}
	h.do("POST", h.admin+"/v1/gates/request-rate", "secret", `{"mode":"enforce"}`, nil)
	if resp, _ := h.do("GET", h.base+"/v1/x", "", "", key); resp.StatusCode != 429 {
		t.Fatalf("enforce again: %d", resp.StatusCode)
	}
	if resp, _ := h.do("POST", h.admin+"/v1/gates/request-rate", "secret", `{"mode":"dark"}`, nil); resp.StatusCode != 400 {
		t.Fatalf("bad mode: %d", resp.StatusCode)
	}
	if resp, _ := h.do("POST", h.admin+"/v1/gates/nope", "secret", `{"mode":"off"}`, nil); resp.StatusCode != 404 {
		t.Fatalf("unknown gate: %d", resp.StatusCode)
	}
}

func TestUpstreamDownIs502(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(policyV1), 0o644)
	u, _ := url.Parse("http://127.0.0.1:1") // nothing listens there
	s, err := New(Options{Config: file, Upstream: u, Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "x", ReloadEvery: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get(front(t, s) + "/v1/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("%d", resp.StatusCode)
	}
}

// A failed upstream is answered like every other answer: the JSON envelope
// with a reason of the enum, the policy's request id header, and valid JSON
// whatever the client sent as its id.
func TestUpstreamErrorsThroughTheEnvelope(t *testing.T) {
	const policy = `version: 1
identity:
  request_id: {header: X-Trace}
  deadline: {header: X-Request-Timeout}
gates:
  - {name: pool, kind: concurrency, limit: 5}
`
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer hang.Close()
	for _, c := range []struct {
		name, upstream string
		hdr            map[string]string
		status         int
		reason, id     string
		effect         bool // a refused connection sent nothing: no effect possible
		method         string
	}{
		{"refused", "http://127.0.0.1:1", map[string]string{"X-Trace": "abc-1"}, 502, "upstream", "abc-1", false, "POST"},
		// A replayable request may have reached the upstream on an attempt
		// before the one refused (a reused connection that failed).
		{"refused, idempotent", "http://127.0.0.1:1", map[string]string{"X-Trace": "abc-3"}, 502, "upstream", "abc-3", true, "GET"},
		{"refused, idempotency key", "http://127.0.0.1:1", map[string]string{"X-Trace": "abc-4", "Idempotency-Key": "k"}, 502, "upstream", "abc-4", true, "POST"},
		{"not utf-8", "http://127.0.0.1:1", map[string]string{"X-Trace": "\xff\xfe\"\\", "X-Request-Id": "other"}, 502, "upstream", "", false, "POST"},
		{"deadline", hang.URL, map[string]string{"X-Trace": "abc-2", "X-Request-Timeout": "20ms"}, 504, "deadline", "abc-2", true, "GET"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, _ := url.Parse(c.upstream)
			s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			req, _ := http.NewRequest(c.method, front(t, s)+"/x", nil)
			for k, v := range c.hdr {
				req.Header[k] = []string{v}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var env struct {
				Error struct {
					Reason         string `json:"reason"`
					EffectPossible bool   `json:"effect_possible"`
					RequestID      string `json:"request_id"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &env); err != nil {
				t.Fatalf("invalid JSON %q: %v", body, err)
			}
			id := resp.Header.Get("X-Trace")
			if resp.StatusCode != c.status || env.Error.Reason != c.reason || env.Error.EffectPossible != c.effect || env.Error.RequestID != id || id == "" ||
				(c.id != "" && id != c.id) || resp.Header.Get("X-Request-Id") != "" {
				t.Fatalf("%d %s (X-Trace %q)", resp.StatusCode, body, id)
			}
		})
	}
}

func TestModeOverrideSurvivesUnrelatedReload(t *testing.T) {
	h := newHarness(t, policyV1)
	if resp, _ := h.do("POST", h.admin+"/v1/gates/request-rate", "secret", `{"mode":"off"}`, nil); resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	os.WriteFile(h.file, []byte(strings.Replace(policyV1, "limit: 5", "limit: 6", 1)), 0o644)
	if changed, err := h.s.Reload(); !changed || err != nil {
		t.Fatal(changed, err)
	}
	if m, _ := h.s.Chain().Mode("request-rate"); m.String() != "off" {
		t.Fatalf("kill switch lost on reload: %v", m)
	}
	// A file that changes the gate's mode wins.
	os.WriteFile(h.file, []byte(strings.Replace(policyV1, "burst: 3}", "burst: 3, mode: shadow}", 1)), 0o644)
	h.s.Reload()
	if m, _ := h.s.Chain().Mode("request-rate"); m.String() != "shadow" {
		t.Fatalf("file's new mode not applied: %v", m)
	}
}

func TestAdminShowsProtectionState(t *testing.T) {
	h := newHarness(t, `version: 1
gates:
  - {name: ladder, kind: ladder, workers: 4}
  - {name: util, kind: utilization, workers: 4, tiers: [default]}
  - {name: fleet, kind: fleet_usage, limit: 10, reserve: {default: 10%}}
  - {name: adaptive, kind: adaptive_concurrency, initial: 30, min: 5, max: 100}
  - {name: deadline, kind: deadline}
  - {name: pool, kind: concurrency, limit: 5, queue: {max_wait: 50ms}}
`)
	h.do("GET", h.base+"/x", "", "", nil)
	_, body := h.do("GET", h.admin+"/v1/gates", "secret", "", nil)
	for _, want := range []string{`"name":"ladder"`, `"level":"normal"`, `"seconds_in"`, `"shed_fraction":0`, `"name":"fleet"`, `"limit":9`,
		`"name":"adaptive"`, `"state":{"limit":30,"in_flight":0,"controller":{`, `"name":"deadline"`, `"waiting":0`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/v1/gates lacks %s:\n%s", want, body)
		}
	}
	_, metrics := h.do("GET", h.admin+"/metrics", "", "", nil)
	for _, want := range []string{`sluice_ladder_level{gate="ladder"} 0`, `sluice_ladder_seconds_total{gate="ladder",level="normal"}`, `sluice_shed_fraction{gate="util"} 0`,
		`sluice_concurrency_limit{gate="adaptive"} 30`, `sluice_concurrency_inflight{gate="adaptive"} 0`,
		`sluice_queue_waiting{gate="pool"} 0`, `sluice_queue_waits_total{gate="pool"} 0`, `sluice_queue_class_waiting{class="other",gate="pool"} 0`,
		`sluice_demand_units_total{class="default",stage="offered",tenant="other"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

// Protection gates limited to some classes (wrapped in a class filter) keep
// their state in /v1/gates and /metrics, and a ladder, which has no quota,
// is never advertised in RateLimit-Policy.
func TestWrappedProtectionGatesKeepTheirCapabilities(t *testing.T) {
	h := newHarness(t, `version: 1
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: "/a/*"}, class: sheddable}
gates:
  - {name: ladder, kind: ladder, workers: 4, classes: [sheddable]}
  - {name: util, kind: utilization, workers: 4, tiers: [sheddable, default], classes: [sheddable]}
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 10/s, burst: 10}
`)
	resp, _ := h.do("GET", h.base+"/a/x", "", "", nil)
	if p := resp.Header.Get("RateLimit-Policy"); p != `"request-rate";q=10;w=1` {
		t.Errorf("RateLimit-Policy %q: want only the token bucket", p)
	}
	_, body := h.do("GET", h.admin+"/v1/gates", "secret", "", nil)
	for _, want := range []string{`"level":"normal"`, `"seconds_in"`, `"shed_fraction":0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/v1/gates lacks %s:\n%s", want, body)
		}
	}
	_, metrics := h.do("GET", h.admin+"/metrics", "", "", nil)
	for _, want := range []string{`sluice_ladder_level{gate="ladder"} 0`, `sluice_ladder_seconds_total{gate="ladder",level="normal"}`, `sluice_shed_fraction{gate="util"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Mode switches made while the policy reloads are never lost: before, 19
// of 5,973 switches under concurrent reloads were, 13 of them already
// answered 200. Here 10,000 switches go in during 500 reloads of an
// unrelated change, and after each one answered 200 the gate is in the
// mode it set.
func TestModeSwitchesDuringReloadsAreNeverLost(t *testing.T) {
	h := newHarness(t, policyV1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 500 {
			os.WriteFile(h.file, []byte(strings.Replace(policyV1, "limit: 5", "limit: "+strconv.Itoa(5+i%2), 1)), 0o644)
			h.s.Reload()
		}
	}()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	modes := []string{"shadow", "off", "enforce"}
	lost := 0
	for i := range 10_000 {
		m := modes[i%3]
		req, _ := http.NewRequest("POST", h.admin+"/v1/gates/request-rate", strings.NewReader(`{"mode":"`+m+`"}`))
		req.Header.Set("Authorization", "Bearer secret")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("switch %d: %d", i, resp.StatusCode)
		}
		if got, _ := h.s.Chain().Mode("request-rate"); got.String() != m {
			lost++
		}
	}
	<-done
	if lost > 0 {
		t.Fatalf("%d of 10,000 switches answered 200 were lost to a concurrent reload", lost)
	}
}

// The admin API can switch gates off: on a non-loopback address it needs a
// configured token, a generated one is never logged (it goes to a file
// only this user can read), and the admin listener cuts idle and dripping
// connections.
func TestAdminListenerGuards(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, addr := range []string{"0.0.0.0:0", ":9901", "192.0.2.1:9901"} {
		if _, err := New(Options{ConfigData: []byte(policyV1), Upstream: u, Admin: addr, Logger: quiet}); err == nil {
			t.Errorf("admin on %s without a token: started", addr)
		}
	}
	var logs strings.Builder
	s, err := New(Options{ConfigData: []byte(policyV1), Upstream: u, Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		AdminTimeout: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), s.opts.AdminToken) {
		t.Fatal("the generated admin token was logged")
	}
	file := regexp.MustCompile(`file=(\S+)`).FindStringSubmatch(logs.String())
	if file == nil {
		t.Fatalf("no token file in the log: %s", logs.String())
	}
	defer os.Remove(file[1])
	data, err := os.ReadFile(file[1])
	fi, _ := os.Stat(file[1])
	if err != nil || strings.TrimSpace(string(data)) != s.opts.AdminToken || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %q %v %v", data, err, fi.Mode())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	_, admin := s.Addrs()
	// A POST that drips its body is cut by the read timeout.
	c, err := net.Dial("tcp", admin.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/gates/request-rate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound for a broken test only
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("a dripped admin request was not cut: %v", err)
	}
}

// inFlight returns what the pool gate (limit 5) counts in flight now: a
// probe of a fresh tenant takes and gives back one slot. The decision
// describes the tightest gate; when that is the fresh tenant's bucket (2 of
// 3 left), the pool had at least 4 of 5 left after the probe: nothing else
// in flight.
func (h *harness) inFlight() int64 {
	h.t.Helper()
	h.probes++
	c := h.s.Chain()
	for _, g := range c.Gates() {
		if g.Name() != "pool" {
			continue
		}
		r := &sluice.Request{Tenant: "probe-" + strconv.Itoa(h.probes), Class: "default", Cost: 1}
		d, p := gatetest.Decide(context.Background(), g, r, c.Clock().Now())
		if !d.Admitted {
			return 5
		}
		g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: c.Clock().Now()})
		return 5 - 1 - d.Remaining
	}
	return 0
}

// A reload that changes only the store's key cap, or drops a gate and adds
// it again, keeps the gates' state: before, both reset every in-flight
// count, and the upstream reached 30 requests in flight against a limit of
// 10.
func TestReloadKeepsStateAcrossKeyCapAndReturn(t *testing.T) {
	const pool = "  - {name: pool, kind: concurrency, scope: service, limit: 5}\n"
	h := newHarness(t, policyV1)
	codes := make(chan int, 3)
	for i := range 3 {
		go func() {
			resp, _ := h.do("GET", h.base+"/slow/"+strconv.Itoa(i), "", "", map[string]string{"X-Api-Key": "t" + strconv.Itoa(i)})
			codes <- resp.StatusCode
		}()
	}
	for range 3 {
		<-h.entered
	}
	if n := h.inFlight(); n != 3 {
		t.Fatalf("%d in flight before the reloads", n)
	}
	for _, step := range []struct{ name, policy string }{
		{"key cap", strings.Replace(policyV1, "gates:", "store: {backend: memory, max_keys: 1000}\ngates:", 1)},
		{"pool dropped", strings.Replace(policyV1, pool, "", 1)},
		{"pool back", policyV1},
	} {
		os.WriteFile(h.file, []byte(step.policy), 0o644)
		if changed, err := h.s.Reload(); !changed || err != nil {
			t.Fatalf("%s: reload %v %v", step.name, changed, err)
		}
		if step.name != "pool dropped" {
			if n := h.inFlight(); n != 3 {
				t.Fatalf("after the %s reload the pool counts %d in flight, want the 3 still running", step.name, n)
			}
		}
	}
	close(h.release)
	for range 3 {
		if c := <-codes; c != 200 {
			t.Fatalf("an in-flight request got %d across the reloads", c)
		}
	}
	if n := h.inFlight(); n != 0 {
		t.Fatalf("%d in flight after every request ended", n)
	}
}

// A proxy whose listener cannot bind says which one, and removes the admin
// token file it generated, as when it stops normally.
func TestBindFailureRemovesTheTokenFile(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	u, _ := url.Parse("http://127.0.0.1:1")
	for _, tc := range []struct{ listen, admin, want string }{
		{taken.Addr().String(), "127.0.0.1:0", "proxy listener"},
		{"127.0.0.1:0", taken.Addr().String(), "admin listener"},
	} {
		var logs strings.Builder
		s, err := New(Options{ConfigData: []byte(policyV1), Upstream: u, Listen: tc.listen, Admin: tc.admin,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		file := regexp.MustCompile(`file=(\S+)`).FindStringSubmatch(logs.String())
		if file == nil {
			t.Fatalf("no token file in the log: %s", logs.String())
		}
		if err := s.Run(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run: %v, want an error naming the %s", err, tc.want)
		}
		if _, err := os.Stat(file[1]); !os.IsNotExist(err) {
			os.Remove(file[1])
			t.Errorf("the token file outlived the failed start (%s): %v", tc.want, err)
		}
	}
}

// A policy file that goes away under the watcher (deleted, a symbolic link
// swapped to nothing) is logged once, not once a check, and the policy
// loaded keeps serving (nothing was logged until a SIGHUP).
func TestWatcherLogsAGonePolicyFileOnce(t *testing.T) {
	h := newHarness(t, policyV1)
	if err := os.Remove(h.file); err != nil {
		t.Fatal(err)
	}
	h.poll(5)
	if n := strings.Count(h.log.String(), "policy file unreadable"); n != 1 {
		t.Errorf("the gone file is logged %d times, want once:\n%s", n, h.log.String())
	}
	if len(h.s.Chain().Gates()) == 0 {
		t.Error("the loaded policy stopped serving")
	}
	h.replace(policyV1) // back: a later loss is news again
	h.poll(3)
	os.Remove(h.file)
	h.poll(3)
	if n := strings.Count(h.log.String(), "policy file unreadable"); n != 2 {
		t.Errorf("a second loss after the file came back is logged %d times in all, want 2", n)
	}
}
