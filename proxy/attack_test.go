package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
)

// slowPolicy protects an upstream of 10 workers with a service-wide
// concurrency limit of 10, as the demo's worker-pool gate does.
const slowPolicy = `version: 1
service: slow
identity:
  deadline: {header: X-Request-Timeout, default: 5s, max: 30s}
gates:
  - {name: worker-pool, kind: concurrency, scope: service, limit: 10}
`

// attackHarness is a proxy with slowPolicy in front of an upstream that
// serves /big (64 MB) and /x (a few bytes) at once.
func attackHarness(t *testing.T) (s *Server, proxyURL string) {
	t.Helper()
	chunk := make([]byte, 64<<10)
	return serve(t, slowPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", fmt.Sprint(1024*len(chunk)))
			for range 1024 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			return
		}
		io.WriteString(w, "ok")
	}))
}

// legit runs 4 well-behaved clients for d and returns how many of their
// requests got 200 and how many were made.
func legit(t *testing.T, base string, d time.Duration) (ok, total int64) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var okN, n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				resp, err := client.Get(base + "/x")
				n.Add(1)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					okN.Add(1)
				}
				time.Sleep(5 * time.Millisecond) // a client's think time
			}
		}()
	}
	wg.Wait()
	return okN.Load(), n.Load()
}

// dial opens a raw connection to the proxy.
func dial(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Ten connections that ask for a 64 MB response and read 100 bytes of it
// held all 10 worker-pool slots for 75 s despite a 5 s deadline, and
// legitimate clients got 100% 503. The response is now read from the
// upstream into the proxy's buffer and the slot freed: the slow readers
// cost buffer space, not slots.
func TestSlowReadersDoNotHoldSlots(t *testing.T) {
	_, base := attackHarness(t)
	for range 10 {
		c := dial(t, base)
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := io.ReadFull(c, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		// and read nothing more
	}
	ok, total := legit(t, base, 2*time.Second)
	t.Logf("legitimate clients: %d of %d answered 200 beside 10 slow readers", ok, total)
	if ok*10 < total*9 {
		t.Fatalf("legitimate clients got %d of %d 200s beside 10 slow readers", ok, total)
	}
}

// Ten connections that send their body one byte every 0.8 s with a 30 s
// budget gave legitimate clients 100% 503 (each slot held 30 s and taken
// again at once). A body is now read before the request is decided: the
// slow senders hold no slot.
func TestSlowBodiesDoNotHoldSlots(t *testing.T) {
	_, base := attackHarness(t)
	var wg sync.WaitGroup
	done := make(chan struct{})
	defer func() { close(done); wg.Wait() }()
	for range 10 {
		c := dial(t, base)
		fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nX-Request-Timeout: 30s\r\n\r\n")
		drip(c, 800*time.Millisecond, done, &wg)
	}
	ok, total := legit(t, base, 2*time.Second)
	t.Logf("legitimate clients: %d of %d answered 200 beside 10 slow senders", ok, total)
	if ok*10 < total*9 {
		t.Fatalf("legitimate clients got %d of %d 200s beside 10 slow senders", ok, total)
	}
}

// A response that must stream (server-sent events) holds its slot, but
// never past the request's deadline plus the grace, however slowly the
// client reads.
func TestStreamedResponseHoldsSlotUntilDeadlineOnly(t *testing.T) {
	s, base := serve(t, strings.Replace(slowPolicy, "default: 5s", "default: 300ms", 1), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}), func(o *Options) { o.Grace = 200 * time.Millisecond })
	c := dial(t, base)
	fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing more; the slot comes back after 300 ms +
	// 200 ms (well within the poll's bound).
	start := time.Now()
	poll.Until(t, 10*time.Second, func() bool {
		d, tk := s.Chain().Decide(context.Background(), &sluice.Request{})
		tk.Done(sluice.OutcomeUseful)
		return d.Admitted && d.Remaining == 9 // nothing else in flight
	})
	t.Logf("slot free %v after the request started (deadline 300ms + grace 200ms)", time.Since(start).Round(time.Millisecond))
}

// Over real HTTP: case, slash and dot-segment variants of a sheddable route
// are sheddable (the upstream's router, like Express's, serves them all
// with the analytics handler); before, /V1/ANALYTICS/x was default and
// escaped the sheddable budget.
func TestPathVariantsKeepTheirClass(t *testing.T) {
	s, base := serve(t, `version: 1
routes:
  - {match: {path: "/v1/analytics/*"}, class: sheddable}
gates:
  - {name: no-analytics, kind: concurrency, limit: 1, classes: [sheddable]}
`, nil)
	// Hold the one sheddable slot, so any request classified sheddable is
	// refused and any other passes.
	d, tk := s.Chain().Decide(context.Background(), &sluice.Request{Class: sluice.ClassSheddable})
	if !d.Admitted {
		t.Fatal(d)
	}
	defer tk.Done(sluice.OutcomeUseful)
	for _, path := range []string{"/v1/analytics/x", "/V1/ANALYTICS/x", "/v1/Analytics/x/", "//v1//analytics/x", "/v1/./analytics/x", "/v1/y/../analytics/x", "/v1/%61nalytics/x"} {
		c := dial(t, base)
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s: %d, want 503 (classified sheddable)", path, resp.StatusCode)
		}
	}
}

// What the proxy must not pass on: PRI and CONNECT are not proxied, and a
// broken chunked body is the client's 400, never a 502 blamed on the
// upstream.
func TestMalformedRequestsAreTheClientsFault(t *testing.T) {
	_, base := attackHarness(t)
	for _, raw := range []string{
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"PRI /x HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nbroken\r\n0\r\n\r\n",
	} {
		c := dial(t, base)
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %d, want 400", strings.SplitN(raw, "\r\n", 2)[0], resp.StatusCode)
		}
	}
}

// Over real HTTP: a flood of distinct API keys, 5 times what the key table
// holds, does not lock new tenants out; each is admitted on its first
// request (the memory store's test floods 2M keys into the default 1M).
func TestKeyFloodOverHTTP(t *testing.T) {
	_, base := serve(t, `version: 1
store: {backend: memory, max_keys: 1000}
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: per-key, kind: token_bucket, scope: tenant, rate: 1/h, burst: 1}
`, nil)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	get := func(key string) int {
		req, _ := http.NewRequest("GET", base+"/x", nil)
		req.Header.Set("X-Api-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 5000 {
		get("flood-" + strconv.Itoa(i))
		if i%250 == 0 {
			if code := get("new-" + strconv.Itoa(i)); code != 200 {
				t.Fatalf("a new tenant's first request after %d flood keys: %d", i, code)
			}
		}
	}
}

// Over real HTTP: a worker pool of 2 with a wait queue serves a burst of
// 8 concurrent requests (each 20 ms of work) instead of answering 6 of
// them 503 at once; without the queue, the burst's excess is refused.
func TestWaitQueueServesABurst(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // the work
	})
	for _, c := range []struct {
		policy string
		min200 int
	}{
		{"  - {name: pool, kind: concurrency, limit: 2, queue: {max_wait: 2s}}\n", 8},
		{"  - {name: pool, kind: concurrency, limit: 2}\n", 0},
	} {
		_, base := serve(t, "version: 1\ngates:\n"+c.policy, up)
		var ok atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(base + "/x")
				if err != nil {
					return
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		t.Logf("%s→ %d of 8 served", c.policy, ok.Load())
		if c.min200 > 0 && ok.Load() < int64(c.min200) {
			t.Errorf("with a queue, %d of 8 served", ok.Load())
		}
	}
}

// noDeadlinePolicy is slowPolicy with no deadline: as in the README's
// quick start, nothing bounds a request's time but the proxy's own bounds.
const noDeadlinePolicy = `version: 1
service: slow
gates:
  - {name: worker-pool, kind: concurrency, scope: service, limit: 10}
`

// Without a deadline in the policy, a stream and an upgraded connection
// hold their slot for MaxHold at most, however busy they are; before,
// nothing bounded them but the upstream's silence (a client that reads a
// server-sent event stream slowly held its slot as long as it liked).
func TestMaxHoldBoundsStreamsWithoutADeadline(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				if _, err := io.WriteString(w, "data: tick\n\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		}
		echoUpgrade(w)
	})
	s, base := serve(t, noDeadlinePolicy, up, func(o *Options) { o.MaxHold = 300 * time.Millisecond })

	// A stream that keeps coming, read as it comes: cut at MaxHold.
	c := dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second)) // a hang fails
	start := time.Now()
	fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) // ends when the proxy cuts it
	held := time.Since(start)
	poll.Until(t, 10*time.Second, func() bool { return inUse(s) == 0 })
	if held < 300*time.Millisecond {
		t.Errorf("the stream ended after %v, before MaxHold", held)
	}
	t.Logf("a busy stream without a deadline: cut after %v (MaxHold 300ms)", held.Round(time.Millisecond))

	// An upgraded connection with traffic both ways: closed at MaxHold.
	c = dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	start = time.Now()
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	for {
		if _, err := io.WriteString(c, "m"); err != nil {
			break
		}
		if _, err := br.ReadByte(); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	held = time.Since(start)
	poll.Until(t, 10*time.Second, func() bool { return inUse(s) == 0 })
	if held < 300*time.Millisecond {
		t.Errorf("the upgraded connection closed after %v, before MaxHold", held)
	}
	t.Logf("a busy upgraded connection without a deadline: closed after %v (MaxHold 300ms)", held.Round(time.Millisecond))
}

// A fault run's slow-client attack, all at once and scaled down with the
// budgets (a 64th): 30 slow readers of 8 MiB responses (240 MiB asked for,
// 17 MiB of budgets), 70 uploads that stall with 200 of their 256 KiB
// sent, and 12 bodies dripping a byte every half second. Once the budgets
// were spent, responses and bodies streamed holding their slots: every
// probe was refused (0 of 295), with a 30 s deadline and without one.
// Now what the budgets cannot hold is refused before it holds a slot, and
// well-behaved clients keep their 200s.
func TestSlowClientsOnceTheBudgetsAreSpent(t *testing.T) {
	for _, c := range []struct{ name, policy, timeout string }{
		{"deadline-30s", slowPolicy, "X-Request-Timeout: 30s\r\n"},
		{"no-deadline", noDeadlinePolicy, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			chunk := make([]byte, 64<<10)
			_, base := serve(t, c.policy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/big" {
					w.Header().Set("Content-Length", fmt.Sprint(128*len(chunk))) // 8 MiB
					for range 128 {
						if _, err := w.Write(chunk); err != nil {
							return
						}
					}
					return
				}
				io.WriteString(w, "ok")
			}), func(o *Options) { o.BufferMemory, o.BufferDisk = 1<<20, 16<<20 })
			done := make(chan struct{})
			var wg sync.WaitGroup
			defer func() { close(done); wg.Wait() }()
			for range 30 { // slow readers: 240 MiB of answers, 17 MiB of budgets
				conn := dial(t, base)
				conn.(*net.TCPConn).SetReadBuffer(4 << 10) // the kernel takes little for them
				fmt.Fprintf(conn, "GET /big HTTP/1.1\r\nHost: x\r\n%s\r\n", c.timeout)
				io.ReadFull(conn, make([]byte, 100))
			}
			for range 70 { // stalled uploads: 200 of 256 KiB sent
				conn := dial(t, base)
				fmt.Fprintf(conn, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", 256<<10, c.timeout)
				conn.Write(make([]byte, 200<<10))
			}
			for range 12 { // dripping bodies
				conn := dial(t, base)
				fmt.Fprintf(conn, "POST /drip HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n%s\r\n", c.timeout)
				drip(conn, 500*time.Millisecond, done, &wg)
			}
			ok, total := legit(t, base, 3*time.Second)
			t.Logf("legitimate clients: %d of %d answered 200 beside 30 slow readers, 70 stalled uploads, 12 dripping bodies", ok, total)
			if ok*100 < total*95 {
				t.Fatalf("legitimate clients got %d of %d 200s", ok, total)
			}
		})
	}
}
