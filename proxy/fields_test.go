package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
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
	resp, err := http.Get(base + "/x")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rl, pol := resp.Header.Values("Ratelimit"), resp.Header.Values("Ratelimit-Policy")
	if len(rl) != 1 || strings.Contains(rl[0], "up") {
		t.Errorf("RateLimit fields %q, want sluice's one", rl)
	}
	if len(pol) != 1 || strings.Contains(pol[0], "up") {
		t.Errorf("RateLimit-Policy fields %q, want sluice's one", pol)
	}
	if got, want := strings.Join(resp.Header.Values("Link"), " | "), "</a> | </b> | </c>"; got != want {
		t.Errorf("Link fields %q, want %q", got, want)
	}
}
