package proxy

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// A request waiting in a wait queue whose client closes its connection
// leaves the queue, and never reaches the upstream: over both servers
// (net/http's notices with its background read, the proxy's own with
// goneWatch). Without it the request would wait out its max_wait (a
// minute here), then be forwarded for a client no longer there.
func TestQueuedRequestOfAGoneClientLeavesTheQueue(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 4)
	var reached atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		entered <- r.URL.Path
		if r.URL.Path == "/a" {
			<-release
		}
	})
	s, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 1, queue: {max_wait: 60s}}\n", up)
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before the servers close: a failed test must not hang in /a
	var q sluice.Queuer
	for _, g := range s.mw.Chain().Gates() {
		if v, ok := sluice.As[sluice.Queuer](g); ok {
			q = v
		}
	}
	if q == nil {
		t.Fatal("no wait queue in the chain")
	}
	waiting := func() int {
		n, _, _, _ := q.QueueStats(s.mw.Chain().Clock().Now())
		return n
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("after 30 s: %s", what)
			}
		}
	}

	aDone := make(chan int, 1)
	go func() {
		resp, err := http.Get(base + "/a")
		if err != nil {
			aDone <- 0
			return
		}
		resp.Body.Close()
		aDone <- resp.StatusCode
	}()
	if p := <-entered; p != "/a" {
		t.Fatalf("upstream got %s first", p)
	}

	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	until("/b is not waiting in the queue", func() bool { return waiting() == 1 })
	c.Close()
	until("/b still waits in the queue after its client closed the connection", func() bool { return waiting() == 0 })

	free()
	if code := <-aDone; code != 200 {
		t.Fatalf("/a: %d", code)
	}
	resp, err := http.Get(base + "/c")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/c after /b's client left: %d (the slot it waited for must be free)", resp.StatusCode)
	}
	if got := <-entered; got != "/c" {
		t.Fatalf("the upstream got %s after /a: a request whose client had gone", got)
	}
	if n := reached.Load(); n != 2 {
		t.Fatalf("the upstream got %d requests, want 2 (/a and /c)", n)
	}
}

// A client that stays connected keeps its place: a peek at its
// connection (nothing to read yet, or its next pipelined request) is not
// a client gone, nor is a read deadline of the server's that passed while
// the request waited (ReadTimeout 100 ms here).
func TestQueuedRequestOfAConnectedClientIsServed(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		if r.URL.Path == "/a" {
			<-release
		}
	})
	s, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 1, queue: {max_wait: 60s}}\n", up, func(o *Options) { o.ReadTimeout = 100 * time.Millisecond })
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before the servers close: a failed test must not hang in /a
	var q sluice.Queuer
	for _, g := range s.mw.Chain().Gates() {
		if v, ok := sluice.As[sluice.Queuer](g); ok {
			q = v
		}
	}
	go func() {
		if resp, err := http.Get(base + "/a"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// /b, then /b2 pipelined behind it: /b waits with bytes to read on its
	// connection.
	if _, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /b2 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _, _, _ := q.QueueStats(s.mw.Chain().Clock().Now()); n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("/b is not waiting in the queue")
		}
	}
	time.Sleep(max(3*goneEvery, 300*time.Millisecond)) // rounds of peeks, and past the read deadline
	free()
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
