package identify

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ForwardedHeader names the header that trusted proxies append the
// address of their peer to.
type ForwardedHeader uint8

const (
	// XForwardedFor is the de facto X-Forwarded-For list: addresses
	// separated by commas, the newest last (nginx's
	// $proxy_add_x_forwarded_for, most load balancers).
	XForwardedFor ForwardedHeader = iota
	// Forwarded is the RFC 7239 Forwarded header: elements separated by
	// commas, each with a for= node (an IPv4 address, a bracketed IPv6
	// address, either with an optional port, "unknown" or an obfuscated
	// identifier).
	Forwarded
)

var forwardedNames = [...]string{"x-forwarded-for", "forwarded"}

// String returns "x-forwarded-for" or "forwarded".
func (h ForwardedHeader) String() string {
	if int(h) < len(forwardedNames) {
		return forwardedNames[h]
	}
	return "unknown"
}

// ParseForwardedHeader parses "x-forwarded-for" or "forwarded". The error
// lists the names.
func ParseForwardedHeader(s string) (ForwardedHeader, error) {
	for i, n := range forwardedNames {
		if n == s {
			return ForwardedHeader(i), nil
		}
	}
	return 0, fmt.Errorf("identify: forwarded header %q is not one of %s", s, strings.Join(forwardedNames[:], ", "))
}

// Defaults of ClientIP.
const (
	// DefaultIPv4Prefix keys each IPv4 address on its own.
	DefaultIPv4Prefix = 32
	// DefaultIPv6Prefix keys IPv6 clients by their /64: one subscriber or
	// host usually holds a whole /64 (RFC 6177 recommends at least a /56
	// per site), so a per-address limit would be one address change from
	// a bypass.
	DefaultIPv6Prefix = 64
)

// ClientIP says how the client's address is found and grouped into a key.
// The zero value keys by the peer's address (http.Request.RemoteAddr),
// trusting no forwarding header, IPv4 per address and IPv6 per /64.
type ClientIP struct {
	// TrustedProxies are the peers whose forwarding header is believed.
	// Behind one, the client is the right-most address of Header that is
	// not itself a trusted proxy: every address right of it was appended by
	// a proxy of ours, everything left of it is what the client claims. A
	// request from any other peer is keyed by the peer's own address,
	// whatever headers it sends. Empty: no forwarding header is read.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header the trusted proxies maintain.
	// Only that one is read: a client could add the other one, which the
	// proxies pass along untouched. Default XForwardedFor.
	Header ForwardedHeader
	// IPv4Prefix groups IPv4 clients: addresses in one /IPv4Prefix share a
	// key. In [1, 32]; 0: DefaultIPv4Prefix.
	IPv4Prefix int
	// IPv6Prefix groups IPv6 clients the same way. In [1, 128]; 0:
	// DefaultIPv6Prefix.
	IPv6Prefix int
}

// normalize fills in the defaults and checks the ranges.
func (c *ClientIP) normalize() error {
	if c.IPv4Prefix == 0 {
		c.IPv4Prefix = DefaultIPv4Prefix
	}
	if c.IPv6Prefix == 0 {
		c.IPv6Prefix = DefaultIPv6Prefix
	}
	switch {
	case c.IPv4Prefix < 1 || c.IPv4Prefix > 32:
		return fmt.Errorf("IPv4 prefix /%d outside [1, 32]", c.IPv4Prefix)
	case c.IPv6Prefix < 1 || c.IPv6Prefix > 128:
		return fmt.Errorf("IPv6 prefix /%d outside [1, 128]", c.IPv6Prefix)
	case c.Header.String() == "unknown":
		return fmt.Errorf("unknown forwarded header %d", c.Header)
	}
	ps, err := normalizePrefixes(c.TrustedProxies, "trusted proxy")
	c.TrustedProxies = ps
	return err
}

// normalizePrefixes returns a copy of ps, IPv4-mapped prefixes as IPv4
// and host bits cleared; an invalid prefix is an error naming what.
func normalizePrefixes(ps []netip.Prefix, what string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		if !p.IsValid() {
			return nil, fmt.Errorf("%s %d is not a valid prefix", what, i)
		}
		out[i] = unmapPrefix(p).Masked()
	}
	return out, nil
}

// inPrefixes reports whether a is in one of ps.
func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseTrustedProxy parses a CIDR ("10.0.0.0/8", "2001:db8::/32") or one
// address ("192.0.2.7", a /32 or /128). A CIDR with bits set past its
// prefix ("10.0.0.1/8") is refused: it is usually a typo for another
// network. IPv4-mapped IPv6 prefixes become IPv4 prefixes.
func ParseTrustedProxy(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("identify: %q is not an IP address or CIDR", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("identify: %q is not a CIDR (want e.g. 10.0.0.0/8 or 2001:db8::/32)", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("identify: %q has bits set past /%d (did you mean %s?)", s, p.Bits(), p.Masked())
	}
	return unmapPrefix(p), nil
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104) into
// the IPv4 prefix it covers (10.0.0.0/8).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// trusted reports whether a is one of the trusted proxies.
func (c *ClientIP) trusted(a netip.Addr) bool { return inPrefixes(c.TrustedProxies, a) }

// TrustedProxy reports whether the peer at remoteAddr ("ip:port") is one
// of the trusted proxies of the rules' client address (Rules.Client with
// ClientKey, or the tenant's ip part): the client's address is read from
// its forwarding header, and a reverse proxy in front of the service
// appends to that header rather than replacing it (RFC 7239 section 4).
func (id *Identifier) TrustedProxy(remoteAddr string) bool {
	var client, tenant []netip.Prefix
	if id.rules.ClientKey {
		client = id.rules.Client.TrustedProxies
	}
	if id.tenant != nil {
		tenant = id.tenant.rules.ClientIP.TrustedProxies
	}
	if len(client) == 0 && len(tenant) == 0 {
		return false // the common case: no parse of the address
	}
	a, ok := parseHostPort(remoteAddr)
	return ok && (inPrefixes(client, a) || inPrefixes(tenant, a))
}

// errNoClientIP: the peer's address is not an IP address (a Unix socket).
var errNoClientIP = errors.New("no client IP address")

// client returns the client's address: the peer's, or behind a trusted
// proxy the right-most untrusted address of the forwarding header. An
// entry that is no address ("unknown", an obfuscated node, garbage) ends
// the walk: the client is then the last address walked, a trusted proxy's,
// so a client can never choose its key by what it writes there.
func (c *ClientIP) client(remoteAddr string, h http.Header) (netip.Addr, error) {
	peer, ok := parseHostPort(remoteAddr)
	if !ok {
		return netip.Addr{}, errNoClientIP
	}
	if !c.trusted(peer) {
		return peer, nil
	}
	name := "X-Forwarded-For"
	if c.Header == Forwarded {
		name = "Forwarded"
	}
	addr := peer
	vs := h[name]
	for i := len(vs) - 1; i >= 0; i-- { // several fields are one list, in order
		a, done := c.walk(vs[i], addr)
		if addr = a; done {
			return addr, nil
		}
	}
	return addr, nil
}

// walk goes through one header value's list from the right, starting from
// the trusted address addr. It returns the address reached and whether the
// walk is over (an untrusted address or an entry that is no address).
func (c *ClientIP) walk(v string, addr netip.Addr) (netip.Addr, bool) {
	for v != "" {
		var elem string
		if c.Header == Forwarded {
			v, elem = lastElement(v)
		} else {
			i := strings.LastIndexByte(v, ',')
			v, elem = v[:max(i, 0)], v[i+1:]
		}
		elem = strings.Trim(elem, " \t")
		if elem == "" && c.Header == XForwardedFor {
			continue // "a,,b" and a trailing comma: empty list items (RFC 9110 §5.6.1)
		}
		var a netip.Addr
		var ok bool
		if c.Header == Forwarded {
			a, ok = forwardedFor(elem)
		} else {
			a, ok = parseNode(elem)
		}
		if !ok {
			return addr, true
		}
		if !c.trusted(a) {
			return a, true
		}
		addr = a
	}
	return addr, false
}

// parseHostPort parses a peer address, "host:port" or a bare host, into an
// unmapped address without zone.
func parseHostPort(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// parseNode parses one X-Forwarded-For entry: an address, "a.b.c.d:port",
// "[v6]" or "[v6]:port".
func parseNode(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() && a.Zone() == "" {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// lastElement splits the last element off an RFC 7239 Forwarded value:
// elements are separated by commas outside quoted strings (RFC 7239 §4,
// quoted-string as in RFC 9110 §5.6.4).
func lastElement(v string) (rest, elem string) {
	cut := indexUnquoted(v, ',', true)
	if cut < 0 {
		return "", v
	}
	return v[:cut], v[cut+1:]
}

// indexUnquoted returns the index of the first (or, with last, the last)
// sep outside quoted strings in v, or -1.
func indexUnquoted(v string, sep byte, last bool) int {
	at, quoted := -1, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			if !last {
				return i
			}
			at = i
		}
	}
	return at
}

// forwardedFor returns the address of an element's for= parameter. An
// element without for=, or whose node is "unknown", obfuscated or
// malformed, has none.
func forwardedFor(elem string) (netip.Addr, bool) {
	for elem != "" {
		var pair string
		pair, elem = nextPair(elem)
		name, value, ok := strings.Cut(strings.Trim(pair, " \t"), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		value, ok = unquote(value)
		if !ok {
			return netip.Addr{}, false
		}
		return parseForwardedNode(value)
	}
	return netip.Addr{}, false
}

// nextPair splits the first pair off an element (pairs are separated by
// ';' outside quoted strings).
func nextPair(elem string) (pair, rest string) {
	if i := indexUnquoted(elem, ';', false); i >= 0 {
		return elem[:i], elem[i+1:]
	}
	return elem, ""
}

// unquote returns a token as it is and a quoted string without its quotes
// and escapes.
func unquote(v string) (string, bool) {
	if v == "" || v[0] != '"' {
		return v, !strings.ContainsAny(v, "\" \t,;")
	}
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", false
	}
	v = v[1 : len(v)-1]
	if !strings.ContainsRune(v, '\\') {
		return v, !strings.Contains(v, `"`)
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '\\' && i+1 < len(v):
			i++
		case v[i] == '\\' || v[i] == '"':
			return "", false
		}
		b.WriteByte(v[i])
	}
	return b.String(), true
}

// parseForwardedNode parses an RFC 7239 §6 node: an IPv4 address or a
// bracketed IPv6 address, with an optional port (a number or an obfuscated
// "_name"). "unknown" and obfuscated identifiers are no address.
func parseForwardedNode(s string) (netip.Addr, bool) {
	host := s
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 || (end+1 < len(s) && s[end+1] != ':') {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
	} else if h, _, ok := strings.Cut(s, ":"); ok {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// key returns the text of a's group: the address itself for a full-length
// prefix, else the masked prefix ("2001:db8:1:2::/64").
func (c *ClientIP) key(a netip.Addr) string {
	bits := c.IPv6Prefix
	if a.Is4() {
		bits = c.IPv4Prefix
	}
	if bits >= a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits)
	return p.String()
}
