package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
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
	for _, name := range []string{"cap", "budget"} {
		t.Run(name, func(t *testing.T) {
			_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Write(want)
			}), func(o *Options) {
				if name == "cap" {
					o.MaxResponseBuffer = 100 << 10
				} else {
					o.BufferMemory, o.BufferDisk = 64<<10, 100<<10
				}
			})
			resp, body := roundTrip(t, base, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp.StatusCode != 200 || len(body) != len(want) || sha256.Sum256([]byte(body)) != sha256.Sum256(want) {
				t.Errorf("%d, %d bytes (want 200, %d bytes, the same)", resp.StatusCode, len(body), len(want))
			}
		})
	}
}

// A request body past what the buffer budgets hold streams on to the
// upstream, whole and in order: the chunk read when the budget ran out
// (up to 32 KiB from the middle) goes first, then the rest. The spool
// used to refuse that chunk and the copy drop it: 8 KiB of 256 KiB missing
// on the proxy's own server (a chunked body, so the upstream could not
// tell), a 502 over net/http.
func TestRequestBodyPastTheBudgetKeepsEveryByte(t *testing.T) {
	want := make([]byte, 256<<10)
	for i := range want {
		want[i] = byte(i * 7 / 3)
	}
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
			got := make(chan []byte, 1)
			_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				if err != nil {
					b = nil
				}
				got <- b
			}), func(o *Options) { o.BufferMemory, o.BufferDisk = c.memory, c.dsk })
			var body io.Reader = bytes.NewReader(want)
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
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if b := <-got; len(b) != len(want) || sha256.Sum256(b) != sha256.Sum256(want) {
				t.Fatalf("the upstream got %d bytes (want %d, the same)", len(b), len(want))
			}
		})
	}
}

// A chunked body (no length to refuse up front) that streams past the
// buffer budgets stays within MaxBodyBytes: the upstream never gets more
// than that as a whole body, and the client no 200. The rest of such a
// body used to stream unbounded over both servers (fasthttp's
// MaxRequestBodySize does not bound a streamed chunked body): 256 KiB
// reached the upstream whole with MaxBodyBytes at 100 KiB.
func TestStreamedChunkedBodyStaysWithinMaxBodyBytes(t *testing.T) {
	const max = 100 << 10
	got := make(chan int, 1)
	_, base := serve(t, parityPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			got <- -1 // broken off: not a body the upstream takes
			return
		}
		got <- len(b)
	}), func(o *Options) { o.BufferMemory, o.BufferDisk, o.MaxBodyBytes = 1, 1, max })
	req, err := http.NewRequest("POST", base+"/upload", io.MultiReader(bytes.NewReader(make([]byte, 256<<10))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("a body of 256 KiB past MaxBodyBytes %d answered 200", max)
		}
	}
	select {
	case n := <-got:
		if n > max {
			t.Errorf("the upstream got a whole body of %d bytes, more than MaxBodyBytes %d", n, max)
		}
	default: // never reached the upstream
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

// bodyCap gives a body of exactly its cap whole, and one byte more as the
// bytes within the cap, then errBodyCap.
func TestBodyCapAtItsBound(t *testing.T) {
	for _, c := range []struct {
		size     int
		wantN    int
		wantFail bool
	}{{10, 10, false}, {11, 10, true}, {0, 0, false}, {4096, 10, true}} {
		b, err := io.ReadAll(&bodyCap{r: bytes.NewReader(make([]byte, c.size)), left: 10})
		if len(b) != c.wantN || (err != nil) != c.wantFail || (err != nil && !errors.Is(err, errBodyCap)) {
			t.Errorf("a body of %d through a cap of 10: %d bytes, %v", c.size, len(b), err)
		}
	}
}
