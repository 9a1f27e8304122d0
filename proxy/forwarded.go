package proxy

import (
	"net/netip"
	"strings"
)

// forwardedFor returns the RFC 7239 Forwarded element naming the peer at
// remoteAddr ("ip:port") as the client of this hop: for=192.0.2.7, or an
// IPv6 address bracketed and quoted (section 6), "unknown" when the
// address is not an IP address.
func forwardedFor(remoteAddr string) string {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return "for=unknown"
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return "for=" + a.String()
	}
	var b strings.Builder
	b.WriteString(`for="[`)
	b.WriteString(a.WithZone("").String())
	b.WriteString(`]"`)
	return b.String()
}

// joinFields joins the values of a field that came several times into one
// list (RFC 9110 section 5.3), in a new slice.
func joinFields(vs [][]byte) []byte {
	var b []byte
	for i, v := range vs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, v...)
	}
	return b
}
