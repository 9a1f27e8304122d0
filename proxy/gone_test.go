package proxy

import (
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
)

// queued is a proxy with a worker pool of one and a wait queue of a
// minute in front of an upstream that holds /a until free is called, so
// that every other request waits.
type queued struct {
	t       *testing.T
	base    string
	q       sluice.Queuer
	s       *Server
	free    func()
	entered chan string // every path the upstream gets, in order
	reached atomic.Int64
}

func newQueued(t *testing.T, opts ...func(*Options)) *queued {
	t.Helper()
	release := make(chan struct{})
	p := &queued{t: t, entered: make(chan string, 16)}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.reached.Add(1)
		p.entered <- r.URL.Path
		if r.URL.Path == "/a" {
			<-release
		}
	})
	p.s, p.base = serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 1, queue: {max_wait: 60s}}\n", up, opts...)
	p.free = sync.OnceFunc(func() { close(release) })
	t.Cleanup(p.free) // before the servers close: a failed test must not hang in /a
	for _, g := range p.s.mw.Chain().Gates() {
		if v, ok := sluice.As[sluice.Queuer](g); ok {
			p.q = v
		}
	}
	if p.q == nil {
		t.Fatal("no wait queue in the chain")
	}
	return p
}

func (p *queued) waiting() int {
	n, _, _, _ := p.q.QueueStats(p.s.mw.Chain().Clock().Now())
	return n
}

// until waits for cond, for 30 s at most (a failure, not a bound).
func (p *queued) until(what string, cond func() bool) {
	p.t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			p.t.Fatalf("after 30 s: %s", what)
		}
	}
}

// hold sends /a, which takes the pool's one slot until free; the
// returned channel gives its status.
func (p *queued) hold() chan int {
	p.t.Helper()
	done := make(chan int, 1)
	go func() {
		resp, err := http.Get(p.base + "/a")
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	if got := <-p.entered; got != "/a" {
		p.t.Fatalf("upstream got %s first", got)
	}
	return done
}

func (p *queued) dial() *net.TCPConn {
	p.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	if err != nil {
		p.t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// afterGone frees /a and checks that the pool's slot serves the next
// request and that the upstream got nothing but /a and it.
func (p *queued) afterGone(held chan int) {
	p.t.Helper()
	p.free()
	if code := <-held; code != 200 {
		p.t.Fatalf("/a: %d", code)
	}
	resp, err := http.Get(p.base + "/c")
	if err != nil {
		p.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		p.t.Fatalf("/c after the client left: %d (the slot it waited for must be free)", resp.StatusCode)
	}
	if got := <-p.entered; got != "/c" {
		p.t.Fatalf("the upstream got %s after /a: a request whose client had gone", got)
	}
	if n := p.reached.Load(); n != 2 {
		p.t.Fatalf("the upstream got %d requests, want 2 (/a and /c)", n)
	}
}

// A request waiting in a wait queue whose client closes its connection
// leaves the queue, and never reaches the upstream: over both servers
// (net/http's notices with its background read, the proxy's own with
// goneWatch). Without it the request would wait out its max_wait (a
// minute here), then be forwarded for a client no longer there.
func TestQueuedRequestOfAGoneClientLeavesTheQueue(t *testing.T) {
	p := newQueued(t)
	held := p.hold()
	c := p.dial()
	if _, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	p.until("/b is not waiting in the queue", func() bool { return p.waiting() == 1 })
	c.Close()
	p.until("/b still waits in the queue after its client closed the connection", func() bool { return p.waiting() == 0 })
	p.afterGone(held)
}

// The same behind bytes the server has not read: the client pipelines a
// second request while the first waits, then closes (FIN) or resets
// (RST). A peek at the connection would read the pipelined request's first
// byte, not the end of the stream, and take the client for present; on
// Linux the proxy's own server polls for the FIN or the reset instead.
// (net/http's background read has the same blind spot: skipped there.)
func TestQueuedRequestOfAGoneClientLeavesBehindUnreadBytes(t *testing.T) {
	if netHTTPFront() || runtime.GOOS != "linux" {
		t.Skip("the proxy's own server on Linux only")
	}
	for _, how := range []string{"fin", "rst"} {
		t.Run(how, func(t *testing.T) {
			p := newQueued(t)
			held := p.hold()
			c := p.dial()
			if _, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			p.until("/b is not waiting in the queue", func() bool { return p.waiting() == 1 })
			if _, err := c.Write([]byte("GET /b2 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			if how == "rst" {
				_ = c.SetLinger(0) // Close sends a reset
			}
			c.Close()
			p.until("/b still waits in the queue after its client left", func() bool { return p.waiting() == 0 })
			p.afterGone(held)
		})
	}
}

// A client that stays connected keeps its place: a look at its
// connection (nothing to read yet, or its next pipelined request) is not
// a client gone, nor is a read deadline of the server's that passed while
// the request waited (ReadTimeout 100 ms here).
func TestQueuedRequestOfAConnectedClientIsServed(t *testing.T) {
	p := newQueued(t, func(o *Options) { o.ReadTimeout = 100 * time.Millisecond })
	p.hold()
	c := p.dial()
	defer c.Close()
	// /b, then /b2 pipelined behind it: /b waits with bytes to read on its
	// connection.
	if _, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /b2 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	p.until("/b is not waiting in the queue", func() bool { return p.waiting() == 1 })
	time.Sleep(max(3*goneEvery, 300*time.Millisecond)) // rounds of looks, and past the read deadline
	p.free()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	var got string
	for strings.Count(got, "HTTP/1.1 ") < 2 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("reading /b and /b2: %v (got %q)", err, got)
		}
		got += string(buf[:n])
	}
	if strings.Count(got, "HTTP/1.1 200 ") != 2 {
		t.Fatalf("/b and /b2: %q", got)
	}
}

// BenchmarkGoneWatch: what watching costs a request that may wait (a
// chain with a wait queue), admitted at once: a context, and a place in
// the watch taken and given back.
func BenchmarkGoneWatch(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var w goneWatch
	cc := &coarseConn{Conn: c} // as the server hands it out
	b.ReportAllocs()
	for b.Loop() {
		_, e := w.watch(cc)
		w.done(e)
	}
}

// A request whose client goes away while it runs at the upstream runs on
// to the upstream's answer and holds its slot until then, on both fronts:
// net/http's used to cancel the upstream call and free the slot at once,
// while the upstream could still be working on it. (A busy machine can
// only make the 300 ms look pass where it should fail, never the other
// way.)
func TestGoneClientsRequestHoldsItsSlotUntilTheUpstreamAnswers(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	cancelled := make(chan struct{}, 1)
	s, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			select {
			case <-release:
			case <-r.Context().Done():
				cancelled <- struct{}{}
			}
		}))
	held := func() bool {
		d, tk := s.Chain().Decide(t.Context(), &sluice.Request{})
		if d.Admitted {
			tk.Done(sluice.OutcomeUseful)
		}
		return !d.Admitted
	}
	c := dial(t, base)
	io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-started
	c.Close()
	for range 30 {
		time.Sleep(10 * time.Millisecond)
		select {
		case <-cancelled:
			t.Fatal("the upstream call was cancelled when the client went away")
		default:
		}
		if !held() {
			t.Fatal("the slot was freed while the upstream still ran the request")
		}
	}
	close(release)
	poll.Until(t, 10*time.Second, func() bool { return !held() })
}
