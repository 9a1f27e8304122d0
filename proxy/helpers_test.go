package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// serve runs a proxy with policy in front of the upstream handler up (nil:
// one that answers 200 with nothing) on loopback. It returns the proxy and
// its URL; everything closes when t ends. opts, if given, adjusts the
// options first.
func serve(t *testing.T, policy string, up http.Handler, opts ...func(*Options)) (*Server, string) {
	t.Helper()
	if up == nil {
		up = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	u, _ := url.Parse(upstream.URL)
	o := Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.host.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv.URL
}
