package proxy

import (
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/policy"
)

// perIP is a policy whose one gate admits 2 requests per tenant (1/h
// refills nothing during a test), the tenant keyed as identity says.
func perTenant(identity string) string {
	return "version: 1\nservice: test\nidentity:\n" + identity + `
gates:
  - {name: per-client, kind: token_bucket, scope: tenant, rate: 1/h, burst: 2}
`
}

// codes sends one GET per header set to base over real HTTP and returns
// the status codes.
func codes(t *testing.T, base string, hdrs ...map[string]string) []int {
	t.Helper()
	var out []int
	for _, h := range hdrs {
		req, _ := http.NewRequest("GET", base+"/x", nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		out = append(out, resp.StatusCode)
	}
	return out
}

func wantCodes(t *testing.T, what string, got []int, want ...int) {
	t.Helper()
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("%s: %v, want %v", what, got, want)
			return
		}
	}
}

// Directly (no trusted proxy, or a peer that is not one), the limit is the
// peer's: spoofed X-Forwarded-For and Forwarded values, new on every
// request, do not get a client past it.
func TestPerIPLimitIgnoresSpoofedHeaders(t *testing.T) {
	for name, identity := range map[string]string{
		"no trusted proxy":             "  tenant: {ip: true}",
		"trusted proxies elsewhere":    "  tenant: {ip: true}\n  client_ip: {trusted_proxies: [10.0.0.0/8, \"2001:db8::/32\"]}",
		"trusted elsewhere, Forwarded": "  tenant: {ip: true}\n  client_ip: {trusted_proxies: [10.0.0.0/8], header: forwarded}",
		"composed with the route":      "  tenant: {ip: true, route: true}",
	} {
		_, base := serve(t, perTenant(identity), nil)
		got := codes(t, base,
			map[string]string{"X-Forwarded-For": "198.51.100.1", "Forwarded": "for=198.51.100.1"},
			map[string]string{"X-Forwarded-For": "198.51.100.2", "Forwarded": "for=198.51.100.2"},
			map[string]string{"X-Forwarded-For": "198.51.100.3", "Forwarded": "for=198.51.100.3"},
			map[string]string{"X-Forwarded-For": "10.0.0.1", "Forwarded": "for=10.0.0.1"},
		)
		wantCodes(t, name, got, 200, 200, 429, 429)
	}
}

// Behind a trusted proxy (the test client, on loopback, plays it), the
// limit is the client's that the proxy appended: the right-most untrusted
// entry, whatever the client wrote left of it.
func TestPerIPLimitBehindTrustedProxy(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {ip: true}\n  client_ip: {trusted_proxies: [127.0.0.0/8, \"::1\"]}"), nil)
	xff := func(v string) map[string]string { return map[string]string{"X-Forwarded-For": v} }
	wantCodes(t, "client A", codes(t, base, xff("198.51.100.1"), xff("6.6.6.6, 198.51.100.1"), xff("7.7.7.7,198.51.100.1, 127.0.0.9")), 200, 200, 429)
	wantCodes(t, "client B", codes(t, base, xff("198.51.100.1, 198.51.100.2")), 200)
	wantCodes(t, "IPv4-mapped A", codes(t, base, xff("::ffff:198.51.100.1")), 429)
	// Two addresses of one /64 share a limit; the next /64 has its own.
	wantCodes(t, "one /64", codes(t, base, xff("2001:db8:1:2::1"), xff("[2001:db8:1:2:ffff:ffff:ffff:ffff]:443"), xff("2001:db8:1:2::3")), 200, 200, 429)
	wantCodes(t, "next /64", codes(t, base, xff("2001:db8:1:3::1")), 200)
	// No header from the trusted proxy: the proxy's own address.
	wantCodes(t, "the proxy itself", codes(t, base, nil, nil, nil), 200, 200, 429)
}

// With header: forwarded, only RFC 7239 Forwarded is read: an
// X-Forwarded-For the client adds (which the proxy would pass along) is
// not.
func TestPerIPLimitBehindTrustedProxyForwarded(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {ip: true}\n  client_ip: {trusted_proxies: [127.0.0.0/8], header: forwarded, ipv6_prefix: 48}"), nil)
	fwd := func(v, xff string) map[string]string {
		return map[string]string{"Forwarded": v, "X-Forwarded-For": xff}
	}
	wantCodes(t, "client A", codes(t, base,
		fwd(`for=192.0.2.60;proto=http`, "1.1.1.1"), fwd(`for=192.0.2.60`, "2.2.2.2"), fwd(`for=192.0.2.60`, "3.3.3.3")), 200, 200, 429)
	wantCodes(t, "one /48", codes(t, base,
		fwd(`for="[2001:db8:cafe:1::17]:4711"`, ""), fwd(`for="[2001:db8:cafe:2::17]"`, ""), fwd(`for="[2001:db8:cafe:3::1]"`, "")), 200, 200, 429)
}

// A peer on the IPv6 loopback, directly: keyed by its /64.
func TestPerIPLimitDirectIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	s, _ := serve(t, perTenant("  tenant: {ip: true}"), nil)
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	wantCodes(t, "::1", codes(t, srv.URL, map[string]string{"X-Forwarded-For": "198.51.100.1"}, nil, nil), 200, 200, 429)
}

func jwt(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".c2lnbmF0dXJl"
}

// A tenant per claim of the bearer token: each organisation its own
// limit; a malformed token is a 400, not the anonymous tenant.
func TestPerClaimLimit(t *testing.T) {
	_, base := serve(t, perTenant("  tenant: {claim: org}"), nil)
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	a, a2, b := jwt(map[string]any{"org": "acme", "sub": "u1"}), jwt(map[string]any{"org": "acme", "sub": "u2"}), jwt(map[string]any{"org": "globex"})
	wantCodes(t, "org acme", codes(t, base, bearer(a), bearer(a2), bearer(a)), 200, 200, 429)
	wantCodes(t, "org globex", codes(t, base, bearer(b)), 200)
	wantCodes(t, "malformed", codes(t, base, bearer("not.a-token"), map[string]string{"Authorization": "Basic eDp5"}), 400, 400)

	_, base = serve(t, perTenant("  tenant: {claim: org, ip: true, required: true}"), nil)
	wantCodes(t, "org + ip", codes(t, base, bearer(a), bearer(b), bearer(a), bearer(a)), 200, 200, 200, 429)
	wantCodes(t, "required", codes(t, base, nil, bearer(jwt(map[string]any{"sub": "x"}))), 400, 400)
}

// Per-key quotas and a per-address limit in one chain: the tenant is the
// API key, and a gate of scope client counts per client address (behind
// the trusted loopback proxy). Key a's quota is its own whatever the
// address; the address 198.51.100.1 is limited whatever the key, so
// minting keys from one address gains nothing; another address is not.
func TestPerKeyAndPerAddressLimitsInOneChain(t *testing.T) {
	_, base := serve(t, `version: 1
identity:
  tenant: {header: X-Api-Key}
  client_ip: {trusted_proxies: [127.0.0.0/8, "::1"]}
gates:
  - {name: per-address, kind: token_bucket, scope: client, rate: 1/h, burst: 3}
  - {name: per-key, kind: token_bucket, scope: tenant, rate: 1/h, burst: 2}
`, nil)
	from := func(key, addr string) map[string]string {
		return map[string]string{"X-Api-Key": key, "X-Forwarded-For": addr}
	}
	wantCodes(t, "key a from one address", codes(t, base, from("a", "198.51.100.1"), from("a", "198.51.100.1"), from("a", "198.51.100.2")), 200, 200, 429)
	wantCodes(t, "new keys from that address", codes(t, base, from("b", "198.51.100.1"), from("c", "198.51.100.1")), 200, 429)
	wantCodes(t, "a new key elsewhere", codes(t, base, from("d", "198.51.100.9")), 200)
}

// A per-address gate needs no ip part in the tenant key, and the client
// address settings are refused where nothing reads them.
func TestClientScopeChecks(t *testing.T) {
	_, err := policy.Parse("p.yaml", []byte("version: 1\nidentity:\n  tenant: {header: X-Api-Key}\n  client_ip: {trusted_proxies: [10.0.0.0/8]}\ngates:\n  - {name: r, kind: token_bucket, scope: tenant, rate: 1/s, burst: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), "p.yaml:4: identity.client_ip: applies only to a tenant keyed by ip (identity.tenant.ip: true) or to gates of scope client") {
		t.Fatalf("client_ip that nothing reads: %v", err)
	}
}
