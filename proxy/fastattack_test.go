package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
)

// Attacks on the proxy's own server (fast.go), each over real loopback
// HTTP. They run over both servers (TestSuiteOverNetHTTP): each held over
// net/http and failed over the proxy's own server before its fix.

// roundTrip writes raw to a new connection to the proxy at base and reads
// one answer.
func roundTrip(t *testing.T, base, raw string) (*http.Response, string) {
	t.Helper()
	c := dial(t, base)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%.60q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// inUse returns how many slots of a service-wide concurrency limit of 10
// are held.
func inUse(s *Server) int64 {
	d, tk := s.Chain().Decide(context.Background(), &sluice.Request{})
	tk.Done(sluice.OutcomeUseful)
	return 9 - d.Remaining
}

// "/v1/analytics/report", the sheddable route, past its gate.
func TestFragmentIsNotDroppedAfterTheGates(t *testing.T) {
	got := make(chan string, 1)
	s, base := serve(t, `version: 1
routes:
  - {match: {path: "/v1/analytics/report"}, class: sheddable}
gates:
  - {name: no-analytics, kind: concurrency, limit: 1, classes: [sheddable]}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.URL.Path }))
	d, tk := s.Chain().Decide(context.Background(), &sluice.Request{Class: sluice.ClassSheddable})
	if !d.Admitted {
		t.Fatal(d)
	}
	defer tk.Done(sluice.OutcomeUseful)
	resp, _ := roundTrip(t, base, "GET /v1/analytics/report#x HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		return // refused: nothing reached the upstream
	}
	if p := <-got; p == "/v1/analytics/report" {
		t.Errorf("the gates admitted /v1/analytics/report#x, the upstream got %q: the sheddable route past its gate", p)
	}
}

// own server merged the trailer into the forwarded head.
func TestRequestTrailersDoNotBecomeHeaders(t *testing.T) {
	got := make(chan []string, 2)
	_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got <- r.Header["X-Api-Key"]
	}))
	for _, c := range []struct {
		head string // the head's fields
		want string // the tenant the gates decided on
	}{
		{"X-Api-Key: attacker\r\n", "attacker"},
		{"Trailer: X-Api-Key\r\n", ""},
	} {
		for _, size := range []int{3, 100 << 10} {
			body := strings.Repeat("b", size)
			resp, _ := roundTrip(t, base, fmt.Sprintf("POST /x HTTP/1.1\r\nHost: x\r\n%sTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nX-Api-Key: victim\r\n\r\n", c.head, size, body))
			if resp.StatusCode != http.StatusOK {
				continue // refused: nothing reached the upstream
			}
			if k := strings.Join(<-got, ","); k != c.want {
				t.Errorf("%q, body of %d bytes: the gates decided X-Api-Key %q, the upstream got %q", c.head, size, c.want, k)
			}
		}
	}
}

// the read that hit the cap (up to 32 KiB from the middle).
func TestResponsePastTheBufferKeepsEveryByte(t *testing.T) {
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7 / 3)
	}
	_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(want)
	}), func(o *Options) { o.MaxResponseBuffer = 100 << 10 })
	resp, body := roundTrip(t, base, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || len(body) != len(want) || sha256.Sum256([]byte(body)) != sha256.Sum256(want) {
		t.Errorf("%d, %d bytes (want 200, %d bytes, the same)", resp.StatusCode, len(body), len(want))
	}
}

// A response the shared buffer budgets cannot hold is refused with 503
// and Retry-After (reason overload), and its slot is free at once. It
// used to stream, holding the slot for as long as its client took to read
// it: thirty slow readers of 64 MB responses spent the budgets, and from
// then on every slow reader held a slot until its deadline (with no
// deadline, for as long as it liked). What fits is served as before.
func TestResponsePastTheBudgetsIsRefused(t *testing.T) {
	s, base := serve(t, slowPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		if r.URL.Path == "/big" {
			w.Write(make([]byte, 1<<20))
			return
		}
		w.Write(make([]byte, 32<<10))
	}), func(o *Options) { o.BufferMemory, o.BufferDisk = 64<<10, 100<<10 })
	resp, body := roundTrip(t, base, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	var env struct{ Error struct{ Reason string } }
	json.Unmarshal([]byte(body), &env)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || env.Error.Reason != "overload" {
		t.Fatalf("a response past the budgets: %d, Retry-After %q, reason %q (want 503, a Retry-After, overload)", resp.StatusCode, resp.Header.Get("Retry-After"), env.Error.Reason)
	}
	if !strings.Contains(body, busyResponse) {
		t.Errorf("the answer does not say why: %s", body)
	}
	poll.Until(t, 5*time.Second, func() bool { return inUse(s) == 0 })
	// The budgets are whole again: a response that fits is served.
	resp, body = roundTrip(t, base, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || len(body) != 32<<10 {
		t.Errorf("a response that fits, after the refusal: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// A request body the shared buffer budgets cannot hold is refused with 503
// and Retry-After (reason overload) before it is decided, and the upstream
// never sees it. It used to stream on to the upstream, holding an admitted
// slot for as long as its sender took: 70 stalled uploads and 12 dripping
// bodies held every slot once the budgets were spent.
func TestRequestBodyPastTheBudgetsIsRefused(t *testing.T) {
	for _, c := range []struct {
		name        string
		memory, dsk int64
		chunked     bool
	}{
		{"nothing-fits", 1, 1, false},
		{"part-fits", 64 << 10, 100 << 10, false},
		{"part-fits-chunked", 64 << 10, 100 << 10, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var reached atomic.Int64
			s, base := serve(t, slowPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				io.Copy(io.Discard, r.Body)
			}), func(o *Options) { o.BufferMemory, o.BufferDisk = c.memory, c.dsk })
			var body io.Reader = bytes.NewReader(make([]byte, 256<<10))
			if c.chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req, err := http.NewRequest("POST", base+"/upload", body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), busyBody) {
				t.Fatalf("a body past the budgets: %d, Retry-After %q, %s (want 503, a Retry-After, %q)", resp.StatusCode, resp.Header.Get("Retry-After"), b, busyBody)
			}
			if n := reached.Load(); n != 0 {
				t.Errorf("the upstream got %d requests", n)
			}
			if n := inUse(s); n != 0 {
				t.Errorf("%d slots held after the refusal", n)
			}
			if c.memory == 1 {
				return // nothing fits, ever
			}
			// A body that fits goes through.
			resp, err = http.Post(base+"/upload", "text/plain", strings.NewReader("small"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || reached.Load() != 1 {
				t.Errorf("a small body after the refusal: %d, %d reached the upstream", resp.StatusCode, reached.Load())
			}
		})
	}
}

// next byte with no bound.
func TestSilentStreamReleasesItsSlot(t *testing.T) {
	release := make(chan struct{})
	s, base := serve(t, strings.Replace(slowPolicy, "default: 5s", "default: 300ms", 1), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: hello\n\n")
		w.(http.Flusher).Flush()
		select { // silent until the test ends
		case <-release:
		case <-r.Context().Done():
		}
	}), func(o *Options) { o.Grace = 200 * time.Millisecond })
	defer close(release)
	c := dial(t, base)
	fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Fatal(err)
	}
	// The slot comes back after 300 ms + 200 ms (well within the bound).
	poll.Until(t, 15*time.Second, func() bool { return inUse(s) == 0 })
}

// client took a truncated response for a whole one.
func TestBrokenStreamIsNotComplete(t *testing.T) {
	_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", "1000")
		io.WriteString(w, "data: part\n\n")
		w.(http.Flusher).Flush()
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close() // 988 bytes short
		}
	}))
	c := dial(t, base)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("the client read %d bytes of a 1000-byte response broken off after 12 as a whole response (%q)", len(body), body)
	}
}

// such a stream WriteTimeout after its head, mid-event.
func TestStreamWithoutDeadlineOutlivesWriteTimeout(t *testing.T) {
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond) // the upstream's pace, not a bound the test asserts
		}
	}), func(o *Options) { o.WriteTimeout = 100 * time.Millisecond })
	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(body), "data: 7\n\n") {
		t.Errorf("the stream ended after %q: %v", body, err)
	}
}

// forwarded it as "OPTIONS /*", a request for a resource named "*".
func TestAsteriskFormIsNotForwarded(t *testing.T) {
	got := make(chan string, 1)
	_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.RequestURI }))
	resp, _ := roundTrip(t, base, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("OPTIONS *: %d, want 200", resp.StatusCode)
	}
	select {
	case u := <-got:
		t.Errorf("OPTIONS * reached the upstream as %q", u)
	default:
	}
}

// The answer to a body refused part-way (the budgets cannot hold it)
// reaches a client that is still sending: the proxy half-closes and reads
// on, discarding, instead of closing with the client's bytes unread, which
// made the kernel reset the connection and the client see "connection
// reset by peer" in place of the 503 (seen under a busy make test). A
// body of 8 MiB is more than the kernel's buffers hold, so the client is
// still writing when the answer comes.
func TestRefusedBodyAnswerReachesASendingClient(t *testing.T) {
	_, base := serve(t, slowPolicy, nil, func(o *Options) { o.BufferMemory, o.BufferDisk = 64<<10, 100<<10 })
	body := make([]byte, 8<<20)
	for round := range 30 {
		resp, err := http.Post(base+"/upload", "application/octet-stream", io.MultiReader(bytes.NewReader(body))) // chunked
		if err != nil {
			t.Fatalf("round %d: the answer to a refused body did not arrive: %v", round, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), busyBody) {
			t.Fatalf("round %d: %d %q %v, want 503 with %q", round, resp.StatusCode, b, err, busyBody)
		}
	}
}
