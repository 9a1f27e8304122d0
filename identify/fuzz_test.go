package identify

import (
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluice-go/sluice"
)

// FuzzForwarding throws arbitrary X-Forwarded-For and Forwarded values at
// the client address walk: it never panics, an untrusted peer is always
// its own key, and behind a trusted one the client is either an address
// the header spells or a trusted hop.
func FuzzForwarding(f *testing.F) {
	for _, s := range []string{
		"198.51.100.1", "1.1.1.1, 198.51.100.1, 10.0.0.9", "[2001:db8::1]:80", ",,,", "for=192.0.2.1;proto=http",
		`for="[2001:db8::17]:4711", for=unknown`, `for="\"x\\", for=_h`, "for=\"", "\\\"", "::ffff:1.2.3.4",
	} {
		f.Add(s)
	}
	trusted := prefixes(f, "10.0.0.0/8", "2001:db8:ffff::/48")
	cs := []ClientIP{{TrustedProxies: trusted}, {TrustedProxies: trusted, Header: Forwarded}}
	for i := range cs {
		if err := cs[i].normalize(); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"X-Forwarded-For": {v}, "Forwarded": {v}}
		for _, c := range cs {
			a, err := c.client("203.0.113.5:9", h)
			if err != nil || a.String() != "203.0.113.5" {
				t.Fatalf("untrusted peer keyed as %v (%v)", a, err)
			}
			a, err = c.client("10.0.0.1:9", h)
			if err != nil || !a.IsValid() || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("%v (%v)", a, err)
			}
			if !c.trusted(a) && !spells(v, a.String()) { // an untrusted client is one the header wrote
				t.Fatalf("client %s not in %q", a, v)
			}
			if k := c.key(a); k == "" || len(k) > 64 {
				t.Fatalf("key %q", k)
			}
		}
	})
}

// spells reports whether some comma- or '='-separated piece of v parses
// as the address text s.
func spells(v, s string) bool {
	v = strings.ReplaceAll(v, `\`, "")
	for _, piece := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(",;= \t\"[]", r) }) {
		if a, ok := parseNode(piece); ok && a.String() == s {
			return true
		}
		if a, ok := parseForwardedNode(piece); ok && a.String() == s {
			return true
		}
	}
	return false
}

// FuzzClaim throws arbitrary tokens at the claim reader: it never panics,
// and a claim it returns is bounded UTF-8 without control characters.
func FuzzClaim(f *testing.F) {
	f.Add(token(map[string]any{"sub": "acme"}))
	f.Add(token(map[string]any{"sub": 1e300}))
	f.Add("a.e30.c")
	f.Add("a..c")
	f.Add("a.eyJzdWIiOiJcdTAwMDAifQ.c")
	f.Fuzz(func(t *testing.T, tok string) {
		v, ok, err := claim(tok, "sub", sluice.MaxKeyLen)
		if err != nil || !ok {
			if v != "" {
				t.Fatalf("value %q with ok %v err %v", v, ok, err)
			}
			return
		}
		if !utf8.ValidString(v) || len(v) == 0 || len(v) > sluice.MaxKeyLen || strings.ContainsAny(v, "\x00\x1e\x1f") {
			t.Fatalf("claim %q", v)
		}
		// Through the identifier, as a header-borne bearer token.
		id, _ := New(Rules{Tenant: KeyRules{Parts: []Part{FromClaim("sub"), FromRoute()}}})
		var req sluice.Request
		if _, detail := id.Identify("GET", "/", http.Header{"Authorization": {"Bearer " + tok}}, &req); detail != "" && len(tok) <= maxTokenBytes {
			t.Fatalf("detail %q for a token whose claim reads", detail)
		}
	})
}
