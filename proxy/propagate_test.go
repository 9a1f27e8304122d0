package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/client"
)

// seen records the sluice fields of the requests an upstream got, by path.
type seen struct {
	mu sync.Mutex
	h  map[string]http.Header
}

func (s *seen) record(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil {
		s.h = map[string]http.Header{}
	}
	s.h[r.URL.Path] = r.Header.Clone()
}

func (s *seen) get(t *testing.T, path, field string) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.h[path]
	if !ok {
		t.Fatalf("the upstream never got %s", path)
	}
	return strings.Join(h.Values(field), ",")
}

// A chain of two proxies over real HTTP: service A (behind proxy A) fans
// out to service B (behind proxy B), which trusts A's address as a peer.
// A sheddable request to A reaches B's critical route as sheddable; the
// class a client writes reaches neither service; the deadline B's service
// sees is what A's had left; with B's ladder at DEGRADE, B's service gets
// the level on its request and A's service on B's answer.
func TestDecisionsTravelDownAChain(t *testing.T) {
	var atB, atA seen
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	_, baseB := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout}
  peers: {trusted: [127.0.0.0/8, "::1"]}
routes:
  - {match: {path: /b/critical}, class: critical}
  - {match: {path: /b/hold}, class: critical}
gates:
  - {name: ladder, kind: ladder, workers: 2, degrade: {enter: 0.5, exit: 0.25}, sample_every: 10ms}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atB.record(r)
		if r.URL.Path == "/b/hold" {
			held <- struct{}{}
			<-hold
		}
	}))
	retrier, err := client.New(client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	toB := &http.Client{Transport: &client.Transport{Retrier: retrier, DeadlineHeader: "X-Request-Timeout"}}
	_, baseA := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout}
routes:
  - {match: {path: /a/fanout}, class: sheddable}
gates:
  - {name: pool, kind: concurrency, limit: 10}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atA.record(r)
		ctx, cancel := client.Propagated(r, "X-Request-Timeout")
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", baseB+"/b/critical", nil)
		resp, err := toB.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.Header().Set("B-Status", resp.Status)
		w.Header().Set("B-Level", resp.Header.Get(sluice.LevelHeader))
	}))
	fanout := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", baseA+"/a/fanout", nil)
		req.Header.Set(sluice.ClassHeader, "critical") // the client's own say
		req.Header.Set(sluice.LevelHeader, "shed")
		req.Header.Set("X-Request-Timeout", "20s")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}

	resp := fanout()
	if resp.StatusCode != 200 || resp.Header.Get("B-Status") != "200 OK" {
		t.Fatalf("fan-out: %s, B answered %q", resp.Status, resp.Header.Get("B-Status"))
	}
	if c := atA.get(t, "/a/fanout", sluice.ClassHeader); c != "sheddable" {
		t.Errorf("A's service got class %q, want its route's sheddable (the client wrote critical)", c)
	}
	if l := atA.get(t, "/a/fanout", sluice.LevelHeader); l != "" {
		t.Errorf("A's service got level %q: the client's own reached it", l)
	}
	if c := atB.get(t, "/b/critical", sluice.ClassHeader); c != "sheddable" {
		t.Errorf("B's service got class %q on its critical route, want sheddable: the fan-out raised its class", c)
	}
	dA, errA := time.ParseDuration(atA.get(t, "/a/fanout", "X-Request-Timeout"))
	dB, errB := time.ParseDuration(atB.get(t, "/b/critical", "X-Request-Timeout"))
	if errA != nil || errB != nil || dA > 20*time.Second || dA < 10*time.Second || dB > dA || dB <= 0 {
		t.Errorf("deadlines: A's service got %v (%v), B's %v (%v): want B's at most A's, A's at most the 20s sent", dA, errA, dB, errB)
	}

	// B's ladder to DEGRADE: one request held of its two workers.
	go http.Get(baseB + "/b/hold")
	<-held
	defer close(hold)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(baseB + "/b/critical")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get(sluice.LevelHeader) == "degrade" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's ladder never reached DEGRADE (level %q)", resp.Header.Get(sluice.LevelHeader))
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp = fanout()
	if l := atB.get(t, "/b/critical", sluice.LevelHeader); l != "degrade" {
		t.Errorf("B's service got level %q at DEGRADE", l)
	}
	if l := resp.Header.Get("B-Level"); l != "degrade" {
		t.Errorf("A's service read level %q on B's answer at DEGRADE", l)
	}
}

// From a peer it does not trust, a proxy neither believes nor forwards the
// class and level fields: its upstream sees the route's class and no level.
func TestUntrustedPeerClassIsStripped(t *testing.T) {
	var at seen
	_, base := serve(t, `version: 1
identity:
  peers: {trusted: [10.0.0.0/8]}
routes:
  - {match: {path: /critical}, class: critical}
gates:
  - {name: pool, kind: concurrency, limit: 10}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { at.record(r) }))
	for i, class := range []string{"sheddable", "critical", "gold"} {
		req, _ := http.NewRequest("GET", base+"/critical", nil)
		req.Header.Add(sluice.ClassHeader, class)
		req.Header.Add(sluice.ClassHeader, "sandbox")
		req.Header.Set(sluice.LevelHeader, "shed")
		if i == 2 { // the names in other cases, as a client may write them
			delete(req.Header, sluice.ClassHeader)
			delete(req.Header, sluice.LevelHeader)
			req.Header["sluice-class"] = []string{class}
			req.Header["SLUICE-CLASS"] = []string{"sandbox"}
			req.Header["sLuice-level"] = []string{"shed"}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if c := at.get(t, "/critical", sluice.ClassHeader); c != "critical" {
			t.Errorf("untrusted peer wrote %q: the upstream got class %q, want the route's critical", class, c)
		}
		if l := at.get(t, "/critical", sluice.LevelHeader); l != "" {
			t.Errorf("untrusted peer wrote level shed: the upstream got %q", l)
		}
	}
}

// Behind a trusted proxy the forwarding fields grow by one hop (RFC
// 7239): X-Forwarded-For keeps what the proxy sent and appends its
// address, and so does Forwarded; from any other peer they start anew.
func TestForwardedForAppendsBehindTrustedProxies(t *testing.T) {
	for _, c := range []struct {
		trusted       string
		wantXFF, want string
	}{
		{"[127.0.0.0/8, \"::1\"]", "198.51.100.1, 10.0.0.9, 127.0.0.1", "for=198.51.100.1, for=127.0.0.1"},
		{"[10.0.0.0/8]", "127.0.0.1", ""},
	} {
		var at seen
		_, base := serve(t, perTenant("  tenant: {ip: true}\n  client_ip: {trusted_proxies: "+c.trusted+"}"),
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { at.record(r) }))
		req, _ := http.NewRequest("GET", base+"/x", nil)
		req.Header.Add("X-Forwarded-For", "198.51.100.1")
		req.Header.Add("X-Forwarded-For", "10.0.0.9")
		req.Header.Set("Forwarded", "for=198.51.100.1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := at.get(t, "/x", "X-Forwarded-For"); got != c.wantXFF {
			t.Errorf("trusted %s: X-Forwarded-For %q, want %q", c.trusted, got, c.wantXFF)
		}
		if got := at.get(t, "/x", "Forwarded"); got != c.want {
			t.Errorf("trusted %s: Forwarded %q, want %q", c.trusted, got, c.want)
		}
	}
}

// Fields of one name keep their order through the proxy, both ways, when
// fields before them are deleted (fasthttp's delete moves the header's
// last field into the deleted one's place): a trusted proxy's chain of
// X-Forwarded-For fields behind "Connection: keep-alive" came out
// reversed, and so did any repeated field behind a hop-by-hop one (RFC
// 9110 section 5.3: their order is significant). The messages are written
// raw, their fields in the order that showed it.
func TestRepeatedFieldsKeepTheirOrder(t *testing.T) {
	var (
		mu        sync.Mutex
		xff, lang []string
	)
	_, base := serve(t, perTenant("  tenant: {ip: true}\n  client_ip: {trusted_proxies: [127.0.0.0/8, \"::1\"]}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			xff, lang = r.Header.Values("X-Forwarded-For"), r.Header.Values("Accept-Language")
			mu.Unlock()
			c, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			bw.WriteString("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nLink: </a>; rel=preload\r\n" +
				"Link: </b>; rel=preload\r\nVary: Accept\r\nLink: </c>; rel=preload\r\nContent-Length: 2\r\n\r\nok")
			bw.Flush()
		}))
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: example.test\r\nConnection: keep-alive\r\nKeep-Alive: 300\r\n"+
		"Accept-Language: da\r\nX-Forwarded-Proto: https\r\nAccept-Language: en-GB\r\nX-Forwarded-For: 198.51.100.1\r\n"+
		"X-Forwarded-For: 10.0.0.9\r\nAccept-Language: en\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(xff, " | "), "198.51.100.1, 10.0.0.9, 127.0.0.1"; got != want {
		t.Errorf("X-Forwarded-For %q, want %q", got, want)
	}
	if got, want := strings.Join(lang, " | "), "da | en-GB | en"; got != want {
		t.Errorf("Accept-Language fields %q, want %q", got, want)
	}
	if got, want := strings.Join(resp.Header.Values("Link"), " | "), "</a>; rel=preload | </b>; rel=preload | </c>; rel=preload"; got != want {
		t.Errorf("Link fields %q, want %q", got, want)
	}
	if v := resp.Header.Get("Keep-Alive"); v != "" {
		t.Errorf("Keep-Alive %q reached the client", v)
	}
}

// A client's Connection field cannot strip the decision sluice passes on:
// the class and the deadline reach the upstream even when the client
// names their fields as hop-by-hop (on the net/http front the reverse
// proxy dropped them after the admission had set them, and the upstream
// got no deadline).
func TestConnectionCannotStripTheDecision(t *testing.T) {
	var at seen
	_, base := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout, default: 5s}
routes:
  - {match: {path: /critical}, class: critical}
gates:
  - {name: pool, kind: concurrency, limit: 10}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { at.record(r) }))
	req, _ := http.NewRequest("GET", base+"/critical", nil)
	req.Header.Set("Connection", "sluice-class, x-request-timeout")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := at.get(t, "/critical", sluice.ClassHeader); c != "critical" {
		t.Errorf("the upstream got class %q, want the route's critical", c)
	}
	if d := at.get(t, "/critical", "X-Request-Timeout"); !strings.HasSuffix(d, "ms") {
		t.Errorf("the upstream got deadline %q, want the time left in ms", d)
	}
}
