package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/logbuf"
)

// A Connection field cannot take away what frames or routes a message:
// Content-Length, Transfer-Encoding and Host named in it stay (the proxy
// frames and addresses what it forwards itself), while any other field it
// names is dropped (RFC 9110 section 7.6.1). Naming Content-Length was a
// 502, and stripping framing on a client's word is how requests are
// smuggled past a proxy.
func TestConnectionCannotNameFraming(t *testing.T) {
	var (
		mu         sync.Mutex
		body, drop string
		host       string
	)
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			body, drop, host = string(b), r.Header.Get("X-Drop"), r.Host
			mu.Unlock()
			w.Header().Set("Connection", "Content-Length, X-Drop")
			w.Header().Set("X-Drop", "1")
			w.Header().Set("Content-Length", "2")
			io.WriteString(w, "ok")
		}))
	for _, raw := range []string{
		"POST /x HTTP/1.1\r\nHost: example.test\r\nConnection: Content-Length, Host, Transfer-Encoding, X-Drop\r\n" +
			"X-Drop: 1\r\nContent-Length: 5\r\n\r\nhello",
		"POST /x HTTP/1.1\r\nHost: example.test\r\nConnection: transfer-encoding, x-drop\r\n" +
			"X-Drop: 1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != 200 || string(got) != "ok" {
			t.Fatalf("answered %d %q, want 200 \"ok\"", resp.StatusCode, got)
		}
		if v := resp.Header.Get("X-Drop"); v != "" {
			t.Errorf("the answer's X-Drop %q reached the client", v)
		}
		mu.Lock()
		if body != "hello" {
			t.Errorf("the upstream read body %q, want \"hello\"", body)
		}
		if drop != "" {
			t.Errorf("the request's X-Drop %q reached the upstream", drop)
		}
		if host == "" {
			t.Error("the upstream got no Host")
		}
		body, drop, host = "", "", ""
		mu.Unlock()
	}
}

// When the upstream's answer carries RateLimit fields of its own, the
// client gets sluice's, once each (the upstream's second field of a name
// went through beside sluice's), and the answer's other repeated fields
// in their order.
func TestAdmittedAnswerFieldsReplaceTheUpstreams(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h["Link"] = []string{"</a>", "</b>", "</c>"}
			h["Ratelimit"] = []string{`"up";r=1;t=1`}
			h["RATELIMIT-POLICY"] = []string{`"up";q=2`}
			h["ratelimit"] = []string{`"up2";r=0;t=9`}
			io.WriteString(w, "ok")
		}))
	resp := sluiceFieldsOnly(t, base+"/x")
	if got, want := strings.Join(resp.Header.Values("Link"), " | "), "</a> | </b> | </c>"; got != want {
		t.Errorf("Link fields %q, want %q", got, want)
	}
}

// getOK gets url and checks it answered 200; it returns the answer, its
// body read.
func getOK(t *testing.T, url string) *http.Response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp
}

// sluiceFieldsOnly gets url, whose upstream answers 200 with RateLimit
// fields of its own marked "up", and checks that the client got sluice's
// RateLimit and RateLimit-Policy, one each; it returns the answer.
func sluiceFieldsOnly(t *testing.T, url string) *http.Response {
	t.Helper()
	resp := getOK(t, url)
	rl, pol := resp.Header.Values("Ratelimit"), resp.Header.Values("Ratelimit-Policy")
	if len(rl) != 1 || strings.Contains(rl[0], "up") || len(pol) != 1 || strings.Contains(pol[0], "up") {
		t.Errorf("RateLimit %q and RateLimit-Policy %q, want sluice's one each", rl, pol)
	}
	return resp
}

// sluice's answer fields survive an informational answer before the
// final one (103 Early Hints: Go's reverse proxy clears the header it
// wrote the hints from), and with more repeated names in the answer than
// the proxy puts back in order (maxRepeatedNames) and a hop-by-hop field
// deleted first, the first ones keep theirs: sluice's fields are set in
// place of the upstream's, so no second pass over the order picks other
// names (a pass per field, or one after the hop-by-hop fields' own, did).
func TestAdmittedAnswerFieldsAfterHintsAndManyRepeatedNames(t *testing.T) {
	const names = maxRepeatedNames + 4
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Link", "</s.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("Link")
			for v := range 3 {
				for i := range names {
					h.Add(fmt.Sprintf("X-R%02d", i), fmt.Sprintf("v%d", v))
				}
			}
			h["Ratelimit"] = []string{`"up";r=1;t=1`}
			h["Ratelimit-Policy"] = []string{`"up";q=2`}
			h.Set("Keep-Alive", "timeout=5") // a field the proxy deletes first
			io.WriteString(w, "ok")
		}))
	resp := sluiceFieldsOnly(t, base+"/x")
	for i := range maxRepeatedNames {
		if got := strings.Join(resp.Header.Values(fmt.Sprintf("X-R%02d", i)), ","); got != "v0,v1,v2" {
			t.Errorf("X-R%02d fields %q, want v0,v1,v2", i, got)
		}
	}
}

// Every Connection field of a message counts, not only the first: the
// fields a second one names are dropped both ways.
func TestRepeatedConnectionFieldsAllCount(t *testing.T) {
	var (
		mu     sync.Mutex
		secret string
	)
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			secret = r.Header.Get("X-Secret")
			mu.Unlock()
			if r.URL.Path == "/empty-first" { // raw: an empty Connection field, then one that names
				c, bw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				bw.WriteString("HTTP/1.1 200 OK\r\nConnection:\r\nConnection: X-Answer-Secret\r\nX-Answer-Secret: 1\r\nContent-Length: 2\r\n\r\nok")
				bw.Flush()
				return
			}
			w.Header()["Connection"] = []string{"keep-alive", "X-Answer-Secret"}
			w.Header().Set("X-Answer-Secret", "1")
			io.WriteString(w, "ok")
		}))
	if resp := getOK(t, base+"/empty-first"); resp.Header.Get("X-Answer-Secret") != "" {
		t.Error("behind an empty Connection field, the field a second one names reached the client")
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: example.test\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if v := resp.Header.Get("X-Answer-Secret"); v != "" {
		t.Errorf("the answer's X-Answer-Secret %q reached the client", v)
	}
	mu.Lock()
	defer mu.Unlock()
	if secret != "" {
		t.Errorf("the request's X-Secret %q reached the upstream", secret)
	}
}

// An upstream's field whose name is not a token ("rate limit") does not
// reach the client (fasthttp's parser takes it; net/http's refuses it),
// and the answer's other fields do.
func TestMalformedAnswerFieldNamesDoNotPass(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			bw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\nX-Good: 1\r\nrate limit: x\r\nX-Good: 2\r\nContent-Length: 2\r\n\r\nok")
			bw.Flush()
		}))
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: example.test\r\n\r\n")
	got := rawHead(bufio.NewReader(c)) // Go's reader refuses such a name itself
	if strings.Contains(strings.ToLower(got), "rate limit") {
		t.Errorf("the malformed field reached the client:\n%s", got)
	}
	if strings.HasPrefix(got, "HTTP/1.1 200") && !strings.Contains(got, "X-Good: 1\r\nX-Good: 2\r\n") {
		t.Errorf("the answer's good fields did not pass in order:\n%s", got)
	}
}

// A 101's head reaches the client as an admitted answer's does: sluice's
// RateLimit fields in place of the upstream's, no field whose name is not
// a token, and the upgrade's own Connection and Upgrade kept. The fast
// front passed the upstream's head as it came; the net/http front sent
// the upstream's RateLimit beside sluice's.
func TestUpgradeAnswerFieldsAreAsForAnyAnswer(t *testing.T) {
	for _, malformed := range []bool{false, true} {
		t.Run(map[bool]string{false: "tokens", true: "a malformed name"}[malformed], func(t *testing.T) {
			extra := ""
			if malformed {
				extra = "rate limit: x\r\n"
			}
			_, base := serve(t, perTenant("  tenant: {ip: true}"),
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					c, brw, err := http.NewResponseController(w).Hijack()
					if err != nil {
						return
					}
					defer c.Close()
					brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n" +
						"RateLimit: \"up\";r=99;t=1\r\n" + extra + "X-Good: 1\r\nRateLimit-Policy: \"up\";q=100\r\n\r\n")
					brw.Flush()
					io.Copy(c, brw)
				}))
			c := dial(t, base)
			io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			br := bufio.NewReader(c)
			got := rawHead(br) // Go's reader refuses a malformed name itself
			if malformed && !strings.HasPrefix(got, "HTTP/1.1 101") {
				return // refused (the net/http front refuses such an answer): nothing passed
			}
			if !strings.HasPrefix(got, "HTTP/1.1 101") {
				t.Fatalf("answer:\n%s\nwant a 101", got)
			}
			low := strings.ToLower(got)
			for _, bad := range []string{"rate limit", `"up"`} {
				if strings.Contains(low, bad) {
					t.Errorf("%q reached the client:\n%s", bad, got)
				}
			}
			for _, want := range []string{"\r\nRatelimit: ", "\r\nRatelimit-Policy: ", "\r\nX-Good: 1\r\n", "\r\nUpgrade: echo\r\n"} {
				if strings.Count(strings.ToLower(got), strings.ToLower(want)) != 1 {
					t.Errorf("want one %q in:\n%s", strings.TrimSpace(want), got)
				}
			}
			if !strings.Contains(low, "\r\nconnection: upgrade\r\n") || strings.Contains(low, "close") {
				t.Errorf("want Connection: Upgrade alone in:\n%s", got)
			}
			io.WriteString(c, "hello")
			echo := make([]byte, 5)
			if _, err := io.ReadFull(br, echo); err != nil || string(echo) != "hello" {
				t.Fatalf("echo: %q, %v", echo, err)
			}
		})
	}
}

// An interim answer (103 Early Hints) carries the upstream's fields only:
// sluice's RateLimit fields are the final answer's (the net/http front
// sent them on the 103 as well).
func TestInterimAnswersCarryTheUpstreamsFieldsOnly(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {ip: true}"),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			for _, link := range []string{"</a.css>; rel=preload", "</b.css>; rel=preload"} {
				h.Set("Link", link)
				w.WriteHeader(http.StatusEarlyHints)
			}
			h.Del("Link")
			io.WriteString(w, "ok")
		}))
	var hints []textproto.MIMEHeader
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints {
				hints = append(hints, h)
			}
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/x", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Ratelimit") == "" {
		t.Fatalf("final answer %d %v, want 200 with sluice's RateLimit", resp.StatusCode, resp.Header)
	}
	t.Logf("%d interim answers reached the client", len(hints))
	for i, h := range hints {
		if len(h["Ratelimit"]) > 0 || len(h["Ratelimit-Policy"]) > 0 || len(h["Link"]) != 1 {
			t.Errorf("interim answer %d carried %v, want its one Link field and no RateLimit", i, h)
		}
	}
}

// An answer a proxy cannot pass on is a 502, on either front, and the
// connection to the upstream it came on is not used again: a switch of
// protocols the client never asked for (the fast front passed it on
// without its Upgrade field, and the client's connection went on in
// HTTP), a switch to another protocol than the one asked for, and a
// status outside HTTP's 100 to 599 (the fast front passed "099" on as
// "99", with no framing, and the next answer followed its body).
func TestAnswersAProxyCannotPassOnAre502(t *testing.T) {
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/ok" {
				io.WriteString(w, "ok")
				return
			}
			c, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			switch r.URL.Path {
			case "/101", "/h2c":
				bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			case "/099", "/up099":
				bw.WriteString("HTTP/1.1 099 X\r\nContent-Length: 2\r\n\r\nok")
			case "/600":
				bw.WriteString("HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\nok")
			}
			bw.Flush()
			time.Sleep(100 * time.Millisecond) // what a switched upstream says next
			c.Write([]byte("\x81\x05hello"))
		}))
	for _, path := range []string{"/101", "/h2c", "/099", "/600", "/up099"} {
		c := dial(t, base)
		upgrade := ""
		switch path {
		case "/h2c":
			upgrade = "Connection: Upgrade\r\nUpgrade: h2c\r\n"
		case "/up099": // an upgrade's own path (the fast front's) passed it on
			upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\n"
		}
		// The request, then another on the same connection.
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n"+upgrade+"\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s: answered %d, want 502", path, resp.StatusCode)
			continue
		}
		if resp.Close {
			continue // the next request is not read: nothing to mistake
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		next, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("%s: the next answer on the connection: %v", path, err)
			continue
		}
		body, _ := io.ReadAll(next.Body)
		next.Body.Close()
		if next.StatusCode != 200 || string(body) != "ok" {
			t.Errorf("%s: the next answer on the connection %d %q, want 200 ok", path, next.StatusCode, body)
		}
	}
	// The upstream's connections that carried them are not reused.
	for range 5 {
		if resp := getOK(t, base+"/ok"); resp.StatusCode != 200 {
			t.Fatalf("after them: %d", resp.StatusCode)
		}
	}
}

// An upstream answer that breaks off after its head, before any of it
// reached the client (the answer is read whole first), is a 502, or a 504
// once the request's deadline has passed, on either front: the net/http
// front closed the client's connection with no answer at all.
func TestAnswersThatBreakOffAre502(t *testing.T) {
	_, base := serve(t, "version: 1\nidentity:\n  deadline: {header: X-Request-Timeout}\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			switch r.URL.Path {
			case "/short":
				bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("a", 100))
			case "/badchunk":
				bw.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
			case "/stall":
				bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("a", 100))
				bw.Flush()
				time.Sleep(2 * time.Second)
			}
			bw.Flush()
		}))
	for _, c := range []struct {
		path, timeout string
		want          int
	}{
		{"/short", "", http.StatusBadGateway},
		{"/badchunk", "", http.StatusBadGateway},
		{"/stall", "300ms", http.StatusGatewayTimeout},
	} {
		req, _ := http.NewRequest("GET", base+c.path, nil)
		if c.timeout != "" {
			req.Header.Set("X-Request-Timeout", c.timeout)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s: %v, want an answer", c.path, err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.path, resp.StatusCode, c.want)
		}
	}
}

// An upstream's malformed answer head is refused without its bytes in the
// log: it may carry the upstream's cookies (the fast front logged up to
// 16 KiB of it, a session cookie among them).
func TestMalformedAnswerHeadsStayOutOfTheLog(t *testing.T) {
	// Each on a server of its own: a second failure within a second is
	// not logged.
	for _, path := range []string{"/x", "/up"} {
		var logs logbuf.Buffer
		_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n",
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, bw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				if r.URL.Path == "/up" { // an upgrade's answer, whose first line does not parse
					bw.WriteString("HTTP/1.1101 Switching\r\nSet-Cookie: session=TOPSECRET42\r\n\r\n")
				} else {
					bw.WriteString("HTTP/1.1 200 OK\r\nSet-Cookie: session=TOPSECRET42\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\nok")
				}
				bw.Flush()
			}), func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
		req, _ := http.NewRequest("GET", base+path, nil)
		if path == "/up" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s: answered %d, want 502", path, resp.StatusCode)
		}
		if log := logs.String(); strings.Contains(log, "TOPSECRET42") || !strings.Contains(log, "upstream request failed") {
			t.Errorf("%s: the log quotes the upstream's cookie, or says nothing of the failure:\n%s", path, log)
		}
	}
}

// A request head over 16 KiB is refused with 431 on either front, and one
// under it passes (the net/http front passed heads of up to 1 MiB on to
// the upstream).
func TestRequestHeadsAreBoundedAlike(t *testing.T) {
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n", nil)
	for _, c := range []struct {
		size int
		want int
	}{{10 << 10, 200}, {20 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, _ := http.NewRequest("GET", base+"/x", nil)
		req.Header.Set("X-Big", strings.Repeat("a", c.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%d bytes: %v", c.size, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("a head of %d bytes: %d, want %d", c.size, resp.StatusCode, c.want)
		}
	}
}

// rawHead reads an answer's head from br as it came, up to and with the
// empty line.
func rawHead(br *bufio.Reader) string {
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		head.WriteString(line)
		if err != nil || line == "\r\n" {
			return head.String()
		}
	}
}
