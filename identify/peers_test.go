package identify

import (
	"net/http"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-go/sluice"
)

// A class header lowers a request's class only from a trusted peer, and
// never raises it: a sheddable fan-out stays sheddable on a critical
// route, a critical one on a sheddable route stays sheddable, an unknown
// class counts as the least protected, and the same header from an
// untrusted address (or from a client, when no peer is trusted) changes
// nothing.
func TestPeerClassLowersNeverRaises(t *testing.T) {
	rules := Rules{
		Routes: []Route{
			{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical},
			{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
		},
		Peers: Peers{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}},
	}
	id, err := New(rules)
	if err != nil {
		t.Fatal(err)
	}
	open, err := New(Rules{Routes: rules.Routes})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id           *Identifier
		remote, path string
		header       []string
		want         string
	}{
		{id, "10.1.2.3:4000", "/v1/routes", []string{"sheddable"}, sluice.ClassSheddable},
		{id, "10.1.2.3:4000", "/v1/routes", []string{"default"}, sluice.ClassDefault},
		{id, "10.1.2.3:4000", "/v1/routes", nil, sluice.ClassCritical},
		{id, "10.1.2.3:4000", "/v1/analytics/x", []string{"critical"}, sluice.ClassSheddable},
		{id, "10.1.2.3:4000", "/v1/routes", []string{"gold"}, sluice.ClassSandbox},
		{id, "10.1.2.3:4000", "/v1/routes", []string{"critical", "sheddable"}, sluice.ClassSheddable},
		{id, "[::1]:4000", "/v1/routes", []string{"default"}, sluice.ClassDefault},
		{id, "[::ffff:10.0.0.1]:4000", "/v1/routes", []string{"default"}, sluice.ClassDefault},
		{id, "192.0.2.7:4000", "/v1/routes", []string{"sheddable"}, sluice.ClassCritical},
		{id, "", "/v1/routes", []string{"sheddable"}, sluice.ClassCritical},
		{id, "not an address", "/v1/routes", []string{"sheddable"}, sluice.ClassCritical},
		{open, "10.1.2.3:4000", "/v1/routes", []string{"sheddable"}, sluice.ClassCritical},
	} {
		h := http.Header{}
		if c.header != nil {
			h[sluice.ClassHeader] = c.header
		}
		var req sluice.Request
		if _, detail := c.id.IdentifyInput(&Input{Method: "POST", Path: c.path, Header: h, RemoteAddr: c.remote}, &req); detail != "" {
			t.Fatal(detail)
		}
		if req.Class != c.want {
			t.Errorf("%s %s %q: class %q, want %q", c.remote, c.path, c.header, req.Class, c.want)
		}
	}
	if hs := id.Headers(); !slices.Contains(hs, sluice.ClassHeader) || !id.ReadsClientIP() {
		t.Errorf("trusted peers: Headers %v (want %s), ReadsClientIP %v", hs, sluice.ClassHeader, id.ReadsClientIP())
	}
	if hs := open.Headers(); slices.Contains(hs, sluice.ClassHeader) || open.ReadsClientIP() {
		t.Errorf("no peers: Headers %v, ReadsClientIP %v", hs, open.ReadsClientIP())
	}
	if _, err := New(Rules{Peers: Peers{Trusted: []netip.Prefix{{}}}}); err == nil {
		t.Error("an invalid trusted peer prefix was accepted")
	}
}

// An order of the policy's own: a class the routes assign below default
// is lowered to, and one outside it counts as the last.
func TestPeerClassFollowsTheOrder(t *testing.T) {
	id, err := New(Rules{
		Routes: []Route{{Path: "/a", Class: "gold"}},
		Peers:  Peers{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Order: []string{"gold", "silver", "bronze"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]string{"silver": "silver", "bronze": "bronze", "gold": "gold", "critical": "bronze"} {
		var req sluice.Request
		id.IdentifyInput(&Input{Method: "GET", Path: "/a", Header: http.Header{sluice.ClassHeader: {v}}, RemoteAddr: "127.0.0.1:1"}, &req)
		if req.Class != want {
			t.Errorf("peer says %q: class %q, want %q", v, req.Class, want)
		}
	}
}
