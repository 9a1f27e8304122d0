package proxy

import (
	"bufio"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluice-go/sluice/identify"
)

// FuzzGatesSeeTheForwardedPath: for any request target the proxy's own
// server takes, the path the gates classify is the path the upstream
// decodes from the target it is sent (the class of the '#' defect: a
// gate and an upstream that read one target two ways), and nothing
// panics.
func FuzzGatesSeeTheForwardedPath(f *testing.F) {
	for _, s := range []string{"/", "/v1/items/42?x=1", "/a%2Fb", "/a#b", "/a?b#c", "//x//y", "/a/../b", "http://h/p?q", "/%zz", "*", "/%23", "/a?#"} {
		f.Add(s)
	}
	fs := &fastServer{s: &Server{}}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	f.Fuzz(func(t *testing.T, target string) {
		var req fasthttp.Request
		raw := "GET " + target + " HTTP/1.1\r\nHost: front\r\n\r\n"
		if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return // the server refuses it before the gates
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, addr, nil)
		var in identify.Input
		if !fs.input(&ctx, &in, nil, false) || len(target) == 0 || target[0] != '/' {
			return // refused (400), or not origin form
		}
		gate := strings.Clone(in.Path) // in.Path may view the target's buffer, which outbound rewrites
		fs.outbound(&ctx, nil, false)
		sent := string(ctx.Request.Header.RequestURI())
		u, err := url.ParseRequestURI(sent)
		if err != nil {
			t.Fatalf("target %q: sent %q, which the upstream cannot parse: %v", target, sent, err)
		}
		if u.Path != gate {
			t.Fatalf("target %q: the gates saw path %q, the upstream decodes %q from %q", target, gate, u.Path, sent)
		}
	})
}
