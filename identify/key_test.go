package identify

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func prefixes(t testing.TB, ss ...string) []netip.Prefix {
	t.Helper()
	var ps []netip.Prefix
	for _, s := range ss {
		p, err := ParseTrustedProxy(s)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func mustClientIP(t testing.TB, c ClientIP) ClientIP {
	t.Helper()
	if err := c.normalize(); err != nil {
		t.Fatal(err)
	}
	return c
}

// The client behind trusted proxies is the right-most address that is not
// one of them; from any other peer, the peer itself, whatever it sends.
func TestClientIPFromXForwardedFor(t *testing.T) {
	c := mustClientIP(t, ClientIP{TrustedProxies: prefixes(t, "10.0.0.0/8", "2001:db8:ffff::/48")})
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"direct, no header", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"direct, spoofed header ignored", "203.0.113.9:5555", []string{"198.51.100.1"}, "203.0.113.9"},
		{"one trusted hop", "10.1.2.3:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"client's own entries left of the real one", "10.1.2.3:80", []string{"1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
		{"two trusted hops", "10.1.2.3:80", []string{"198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"several fields are one list", "10.1.2.3:80", []string{"1.1.1.1", "198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"empty items skipped", "10.1.2.3:80", []string{"198.51.100.1,, ,"}, "198.51.100.1"},
		{"ports and brackets", "10.1.2.3:80", []string{"[2001:db8:1:2::7]:443"}, "2001:db8:1:2::/64"},
		{"IPv4 with port", "10.1.2.3:80", []string{"198.51.100.1:1234"}, "198.51.100.1"},
		{"all trusted: the left-most", "10.1.2.3:80", []string{"10.7.7.7, 10.8.8.8"}, "10.7.7.7"},
		{"garbage stops at the last trusted hop", "10.1.2.3:80", []string{"198.51.100.1, not-an-ip, 10.8.8.8"}, "10.8.8.8"},
		{"no header from a trusted peer", "10.1.2.3:80", nil, "10.1.2.3"},
		{"IPv4-mapped peer is IPv4", "[::ffff:10.1.2.3]:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"IPv4-mapped client is IPv4", "10.1.2.3:80", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		{"IPv6 peer with zone", "[fe80::1%eth0]:80", nil, "fe80::/64"},
		{"trusted IPv6 proxy", "[2001:db8:ffff:1::1]:80", []string{"2001:db8:aa:bb::1"}, "2001:db8:aa:bb::/64"},
	} {
		h := http.Header{}
		for _, v := range tc.xff {
			h.Add("X-Forwarded-For", v)
		}
		a, err := c.client(tc.peer, h)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := c.key(a); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, err := c.client("@", nil); err == nil {
		t.Error("a Unix socket peer has an address")
	}
}

// RFC 7239 Forwarded: quoted IPv6 nodes, ports, other parameters, and
// nodes that are no address.
func TestClientIPFromForwarded(t *testing.T) {
	c := mustClientIP(t, ClientIP{TrustedProxies: prefixes(t, "10.0.0.0/8"), Header: Forwarded})
	for _, tc := range []struct{ v, want string }{
		{`for=192.0.2.60;proto=http;by=203.0.113.43`, "192.0.2.60"},
		{`for="[2001:db8:cafe::17]:4711"`, "2001:db8:cafe::/64"},
		{`For="[2001:db8:cafe::17]"`, "2001:db8:cafe::/64"},
		{`for=192.0.2.43, for=198.51.100.17`, "198.51.100.17"},
		{`for=192.0.2.43, for=10.2.2.2;by=10.0.0.1`, "192.0.2.43"},
		{`for="192.0.2.43:47011"`, "192.0.2.43"},
		{`for=192.0.2.43, for=unknown`, "10.1.1.1"}, // the proxy did not know: the last trusted hop
		{`for=192.0.2.43, for=_hidden`, "10.1.1.1"},
		{`for="\"quoted, comma\"", for=198.51.100.2`, "198.51.100.2"},
		{`proto=https;for="[2001:db8::1]";host="a,b"`, "2001:db8::/64"},
		{`for=2001:db8::1`, "10.1.1.1"}, // an IPv6 node must be bracketed and quoted
		{`for="[2001:db8::1`, "10.1.1.1"},
		{``, "10.1.1.1"},
	} {
		h := http.Header{"Forwarded": {tc.v}, "X-Forwarded-For": {"198.51.100.99"}}
		a, err := c.client("10.1.1.1:80", h)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.key(a); got != tc.want {
			t.Errorf("Forwarded: %s: %s, want %s", tc.v, got, tc.want)
		}
	}
}

// A client that does not come through a trusted proxy is keyed by its own
// address whatever forwarding headers it writes; through one, whatever it
// writes left of the proxy's entry changes nothing.
func TestNoSpoofing(t *testing.T) {
	cs := []ClientIP{
		mustClientIP(t, ClientIP{TrustedProxies: prefixes(t, "10.0.0.0/8")}),
		mustClientIP(t, ClientIP{TrustedProxies: prefixes(t, "10.0.0.0/8"), Header: Forwarded}),
	}
	rapid.Check(t, func(t *rapid.T) {
		hdr := ForwardedHeader(rapid.IntRange(0, 1).Draw(t, "header"))
		c := cs[hdr]
		junk := rapid.SliceOfN(rapid.String(), 0, 3).Draw(t, "junk")
		h := http.Header{"X-Forwarded-For": junk, "Forwarded": junk}
		peer := netip.AddrFrom4([4]byte{203, 0, 113, rapid.Byte().Draw(t, "peer")})
		if a, err := c.client(peer.String()+":1", h); err != nil || a != peer {
			t.Fatalf("untrusted peer %s keyed as %s (%v)", peer, a, err)
		}
		// Through a trusted proxy that appended the real client.
		client := netip.AddrFrom4([4]byte{198, 51, 100, rapid.Byte().Draw(t, "client")})
		entry := client.String()
		if hdr == Forwarded {
			entry = "for=" + entry
		}
		h2 := http.Header{"X-Forwarded-For": append(junk, entry), "Forwarded": append(junk, entry)}
		if a, err := c.client("10.0.0.1:1", h2); err != nil || a != client {
			t.Fatalf("client %s behind a trusted proxy keyed as %s (%v)", client, a, err)
		}
	})
}

func TestClientIPConfig(t *testing.T) {
	for _, bad := range []string{"10.0.0.1/8", "10.0.0.0/33", "banana", "fe80::1%eth0", ""} {
		if _, err := ParseTrustedProxy(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if p := prefixes(t, "::ffff:10.0.0.0/104")[0]; p.String() != "10.0.0.0/8" {
		t.Errorf("mapped prefix: %s", p)
	}
	if p := prefixes(t, "192.0.2.7")[0]; p.String() != "192.0.2.7/32" {
		t.Errorf("one address: %s", p)
	}
	for _, c := range []ClientIP{{IPv4Prefix: 33}, {IPv6Prefix: 129}, {IPv4Prefix: -1}, {Header: 9}} {
		if err := c.normalize(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// token returns an unsigned compact JWS with claims (the signature is not
// read).
func token(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	return "eyJhbGciOiJIUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".c2ln"
}

func TestClaim(t *testing.T) {
	for _, tc := range []struct {
		tok, want string
		found     bool
		err       bool
	}{
		{token(map[string]any{"sub": "acme"}), "acme", true, false},
		{token(map[string]any{"sub": 42}), "42", true, false},
		{token(map[string]any{"sub": "ünïcode ok"}), "ünïcode ok", true, false},
		{token(map[string]any{"other": "x"}), "", false, false},
		{token(map[string]any{"sub": nil}), "", false, false},
		{token(map[string]any{"sub": true}), "", false, true},
		{token(map[string]any{"sub": map[string]any{"a": 1}}), "", false, true},
		{token(map[string]any{"sub": ""}), "", false, true},
		{token(map[string]any{"sub": "a\x1fb"}), "", false, true},
		{token(map[string]any{"sub": strings.Repeat("x", 300)}), "", false, true},
		{"a.b", "", false, true},
		{"a.b.c.d", "", false, true},
		{"a.!!!.c", "", false, true},
		{"a." + base64.RawURLEncoding.EncodeToString([]byte("[1]")) + ".c", "", false, true},
		{"a." + base64.URLEncoding.EncodeToString([]byte(`{"sub":"acme"}`)) + ".c", "", false, true}, // padded
	} {
		got, found, err := claim(tc.tok, "sub", sluice.MaxKeyLen)
		if got != tc.want || found != tc.found || (err != nil) != tc.err {
			t.Errorf("%s: %q %v %v, want %q %v err %v", tc.tok, got, found, err, tc.want, tc.found, tc.err)
		}
	}
}

func identifier(t testing.TB, r Rules) *Identifier {
	t.Helper()
	id, err := New(r)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func tenantOf(id *Identifier, in Input) (string, string) {
	var req sluice.Request
	if in.Method == "" {
		in.Method = "GET"
	}
	if in.Path == "" {
		in.Path = "/"
	}
	_, detail := id.IdentifyInput(&in, &req)
	return req.Tenant, detail
}

func TestTenantParts(t *testing.T) {
	routes := []Route{{Method: "POST", Path: "/v1/routes"}}
	claimID := identifier(t, Rules{Tenant: KeyRules{Parts: []Part{FromClaim("org")}}})
	bearer := http.Header{"Authorization": {"Bearer " + token(map[string]any{"org": "acme"})}}
	if k, d := tenantOf(claimID, Input{Header: bearer}); k != "acme" || d != "" {
		t.Errorf("claim: %q %q", k, d)
	}
	if k, d := tenantOf(claimID, Input{Header: http.Header{"Authorization": {"Basic eDp5"}}}); d == "" {
		t.Errorf("a Basic credential gave %q", k)
	}
	if k, d := tenantOf(claimID, Input{}); k != "" || d != "" {
		t.Errorf("no token: %q %q, want the anonymous tenant", k, d)
	}
	gw := identifier(t, Rules{Tenant: KeyRules{Parts: []Part{FromClaim("org")}, Token: Token{Header: "X-Jwt-Assertion"}}})
	if k, _ := tenantOf(gw, Input{Header: http.Header{"X-Jwt-Assertion": {token(map[string]any{"org": "acme"})}}}); k != "acme" {
		t.Errorf("raw token header: %q", k)
	}

	q := identifier(t, Rules{Tenant: KeyRules{Parts: []Part{FromQuery("api_key")}, Required: true}})
	for raw, want := range map[string][2]string{
		"api_key=k1&x=2":          {"k1", ""},
		"x=2&api%5Fkey=k%31":      {"k1", ""},
		"api_key=a&api_key=b":     {"", "more than one query parameter api_key"},
		"api_key=a%20b":           {"", "malformed query parameter api_key"},
		"api_key=%zz":             {"", "malformed query parameter api_key"},
		"x=1":                     {"", "missing query parameter api_key"},
		"api_keyx=1&xapi_key=1&a": {"", "missing query parameter api_key"},
	} {
		if k, d := tenantOf(q, Input{RawQuery: raw}); k != want[0] || d != want[1] {
			t.Errorf("query %q: %q %q, want %q %q", raw, k, d, want[0], want[1])
		}
	}

	comp := identifier(t, Rules{Routes: routes, Tenant: KeyRules{Parts: []Part{FromHeader("x-api-key"), FromClientIP(), FromRoute()}}})
	k1, _ := tenantOf(comp, Input{Method: "POST", Path: "/v1/routes", Header: http.Header{"X-Api-Key": {"a"}}, RemoteAddr: "192.0.2.1:1"})
	k2, _ := tenantOf(comp, Input{Method: "GET", Path: "/v1/routes", Header: http.Header{"X-Api-Key": {"a"}}, RemoteAddr: "192.0.2.1:1"})
	k3, _ := tenantOf(comp, Input{Method: "POST", Path: "/v1/routes", Header: http.Header{"X-Api-Key": {"a"}}, RemoteAddr: "192.0.2.2:1"})
	if k1 != "a\x1f192.0.2.1\x1fPOST /v1/routes" || k2 != "a\x1f192.0.2.1\x1fother" || k3 == k1 {
		t.Errorf("composite keys %q %q %q", k1, k2, k3)
	}
	if _, err := New(Rules{TenantHeader: "X-Api-Key", Tenant: KeyRules{Parts: []Part{FromClientIP()}}}); err == nil {
		t.Error("TenantHeader and Tenant parts both accepted")
	}
	for _, p := range []Part{{Source: SourceHeader}, {Source: SourceClaim}, {Source: SourceRoute, Name: "x"}, {Source: 9}} {
		if _, err := New(Rules{Tenant: KeyRules{Parts: []Part{p}}}); err == nil {
			t.Errorf("part %+v accepted", p)
		}
	}
}

// Composite keys are injective: distinct part values never share a key,
// and no key is over sluice.MaxKeyLen.
func TestCompositeKeysAreDistinctAndBounded(t *testing.T) {
	id := identifier(t, Rules{Tenant: KeyRules{Parts: []Part{FromHeader("A"), FromQuery("b")}}})
	visible := rapid.StringMatching(`[\x21-\x7e]{0,200}`)
	rapid.Check(t, func(t *rapid.T) {
		a1, b1, a2, b2 := visible.Draw(t, "a1"), visible.Draw(t, "b1"), visible.Draw(t, "a2"), visible.Draw(t, "b2")
		in := func(a, b string) Input {
			h := http.Header{}
			if a != "" {
				h.Set("A", a)
			}
			q := ""
			if b != "" {
				q = "b=" + strings.NewReplacer("%", "%25", "&", "%26", "+", "%2B", "=", "%3D").Replace(b)
			}
			return Input{Header: h, RawQuery: q}
		}
		k1, d1 := tenantOf(id, in(a1, b1))
		k2, d2 := tenantOf(id, in(a2, b2))
		if d1 != "" || d2 != "" {
			t.Fatalf("details %q %q", d1, d2)
		}
		if len(k1) > sluice.MaxKeyLen || len(k2) > sluice.MaxKeyLen {
			t.Fatalf("key over the bound: %d, %d bytes", len(k1), len(k2))
		}
		if (k1 == k2) != (a1 == a2 && b1 == b2) {
			t.Fatalf("(%q,%q) and (%q,%q): keys %q and %q", a1, b1, a2, b2, k1, k2)
		}
	})
}

// The header key of old is unchanged: the value itself, so state carries
// over a change of configuration from TenantHeader to Tenant parts.
func TestHeaderKeyIsTheValue(t *testing.T) {
	old := identifier(t, Rules{TenantHeader: "X-Api-Key"})
	parts := identifier(t, Rules{Tenant: KeyRules{Parts: []Part{FromHeader("X-Api-Key")}}})
	h := http.Header{"X-Api-Key": {"acme"}}
	k1, _ := tenantOf(old, Input{Header: h})
	k2, _ := tenantOf(parts, Input{Header: h})
	if k1 != "acme" || k2 != "acme" {
		t.Fatalf("%q %q", k1, k2)
	}
	var req sluice.Request
	if n := testing.AllocsPerRun(100, func() { old.Identify("GET", "/", h, &req) }); n != 0 {
		t.Fatalf("%v allocations for a header key", n)
	}
}

func TestBoundKey(t *testing.T) {
	long := strings.Repeat("k", sluice.MaxKeyLen+1)
	if b := BoundKey(long); len(b) != 65 || b[0] != 0x1e || b == BoundKey(long+"x") {
		t.Fatalf("%q", b)
	}
	if BoundKey("short") != "short" {
		t.Fatal("short key changed")
	}
}

// A lower-case TenantHeader (gRPC metadata keys are lower case) reads its
// canonical header.
func TestTenantHeaderIsCanonical(t *testing.T) {
	id := identifier(t, Rules{TenantHeader: "x-api-key", RequireTenant: true})
	if k, d := tenantOf(id, Input{Header: http.Header{"X-Api-Key": {"acme"}}}); k != "acme" || d != "" {
		t.Fatalf("%q %q", k, d)
	}
}
