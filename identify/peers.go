package identify

import (
	"net/netip"
	"slices"

	"github.com/sluice-go/sluice"
)

// Peers are the other sluice instances whose word on a request's class is
// believed. A service behind its own sluice that calls this one (a
// fan-out) has its sluice set the class it admitted the caller's request
// as on the call (sluice.ClassHeader, or package client from the
// request's context); from a trusted peer that class lowers the route's
// class, never raises it: a call is worth no more to this service than
// the request it serves. From any other peer the header is ignored (and
// sluice proxy strips it before the upstream sees it).
type Peers struct {
	// Trusted are the peers' addresses: prefixes, as ParseTrustedProxy
	// reads them. Empty: the class header is never read.
	Trusted []netip.Prefix
	// Order is the order of classes, most protected first. A class the
	// peer names that Order lacks counts as Order's last (the least
	// protected), and so does a route's class that Order lacks. Default
	// critical, default, sheddable, sandbox.
	Order []string
}

// normalize fills in the default order and checks the prefixes.
func (p *Peers) normalize() error {
	if len(p.Order) == 0 {
		p.Order = []string{sluice.ClassCritical, sluice.ClassDefault, sluice.ClassSheddable, sluice.ClassSandbox}
	}
	ps, err := normalizePrefixes(p.Trusted, "trusted peer")
	p.Trusted = ps
	p.Order = slices.Clone(p.Order)
	return err
}

// rank returns class's place in the order (0: the most protected); a class
// the order lacks ranks last.
func (p *Peers) rank(class string) int {
	if i := slices.Index(p.Order, class); i >= 0 {
		return i
	}
	return len(p.Order) - 1
}

// lower returns class, or the less protected class a trusted peer
// names for the request in (several fields: the least protected of them).
func (p *Peers) lower(class string, in *Input) string {
	vs := in.Header[sluice.ClassHeader]
	if len(vs) == 0 || len(p.Trusted) == 0 {
		return class
	}
	peer, ok := parseHostPort(in.RemoteAddr)
	if !ok || !inPrefixes(p.Trusted, peer) {
		return class
	}
	r := p.rank(class)
	for _, v := range vs {
		if vr := p.rank(v); vr > r {
			r = vr
			class = p.Order[vr]
		}
	}
	return class
}
