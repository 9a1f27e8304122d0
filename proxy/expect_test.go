package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
)

// A request that sends Expect: 100-continue is decided before its body
// comes: admitted, it hears 100 Continue, sends its body and is forwarded
// whole; refused, it gets the 429 at once, never a 100, and its body is
// neither read nor spooled (the upstream never sees it).
func TestExpectContinueIsDecidedFirst(t *testing.T) {
	var got atomic.Int64
	_, base := serve(t, perTenant("  tenant: {header: X-Api-Key}"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.Header().Set("X-Body-Bytes", strconv.FormatInt(n, 10))
	}))
	addr := strings.TrimPrefix(base, "http://")
	const size = 1 << 20
	send := func(tenant string) (first string, resp *http.Response) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nX-Api-Key: "+tenant+"\r\nContent-Length: "+strconv.Itoa(size)+"\r\nExpect: 100-continue\r\n\r\n")
		br := bufio.NewReader(conn)
		first, err = br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(first, " 100 ") {
			return first, nil
		}
		br.ReadString('\n') // the blank line after 100 Continue
		conn.Write(make([]byte, size))
		for resp == nil || resp.StatusCode < 200 { // informational answers go by
			if resp, err = http.ReadResponse(br, nil); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		return first, resp
	}
	for i := range 2 { // the gate admits 2 (burst 2, nothing refills)
		first, resp := send("acme")
		if resp == nil || resp.StatusCode != 200 || resp.Header.Get("X-Body-Bytes") != strconv.Itoa(size) {
			t.Fatalf("admitted request %d: first line %q, response %+v", i, first, resp)
		}
	}
	first, resp := send("acme")
	if resp != nil || !strings.Contains(first, " 429 ") {
		t.Fatalf("refused request: first line %q (want the 429 at once, no 100 Continue)", strings.TrimSpace(first))
	}
	if n := got.Load(); n != 2 {
		t.Fatalf("the upstream got %d requests, want the 2 admitted", n)
	}
}

// An admitted request that waited for 100 Continue and then sends a body
// the shared buffers cannot hold gets the 503 of a full buffer (it is
// read after its admission, holding its slot), the upstream never sees
// it, and its slot is free at once.
func TestExpectContinueBodyPastTheBudgets(t *testing.T) {
	var got atomic.Int64
	s, base := serve(t, slowPolicy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got.Add(1)
	}), func(o *Options) { o.BufferMemory, o.BufferDisk = 64<<10, 100<<10 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	const size = 1 << 20
	io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(size)+"\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(conn)
	if first, err := br.ReadString('\n'); err != nil || !strings.Contains(first, " 100 ") {
		t.Fatalf("first line %q, %v (want 100 Continue: the request is admitted)", first, err)
	}
	br.ReadString('\n')
	go conn.Write(make([]byte, size)) // the proxy may stop reading it
	var resp *http.Response
	for resp == nil || resp.StatusCode < 200 {
		if resp, err = http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a body past the budgets after 100 Continue: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := got.Load(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	poll.Until(t, 5*time.Second, func() bool { return inUse(s) == 0 })
}
