package httpgate

import (
	"net/http"
	"time"

	"github.com/sluice-go/sluice"
)

// identify fills req from r with server-side rules only and returns the
// caller's remaining time budget (0: none). A malformed header yields a
// non-empty detail naming it; req is then not to be used.
func (c *compiled) identify(r *http.Request, req *sluice.Request) (budget time.Duration, detail string) {
	if c.tenantHeader != "" {
		switch vs := r.Header[c.tenantHeader]; {
		case len(vs) > 1:
			return 0, "more than one " + c.tenantHeader + " header"
		case len(vs) == 1:
			if !validToken(vs[0], sluice.MaxKeyLen) {
				return 0, "malformed " + c.tenantHeader + " header"
			}
			req.Tenant = vs[0]
		case c.cfg.RequireTenant:
			return 0, "missing " + c.tenantHeader + " header"
		}
	}
	rt := c.match(r.Method, r.URL.Path)
	req.Class = rt.class
	req.Operation = rt.op
	req.Cost = rt.cost.Fixed
	if h := rt.cost.Header; h != "" {
		if vs := r.Header[h]; len(vs) > 0 {
			v, ok := parseCount(vs[0])
			if !ok || len(vs) > 1 {
				return 0, "malformed " + h + " header (want one non-negative integer)"
			}
			cost := v / rt.cost.Per
			if v%rt.cost.Per != 0 {
				cost++
			}
			req.Cost = min(max(cost, rt.cost.Min), rt.cost.Max)
		}
	}
	budget = min(c.cfg.DefaultDeadline, c.cfg.MaxDeadline)
	if c.deadlineHeader != "" {
		if vs := r.Header[c.deadlineHeader]; len(vs) > 0 {
			d, err := time.ParseDuration(vs[0])
			if err != nil || len(vs) > 1 || d <= 0 {
				return 0, "malformed " + c.deadlineHeader + " header (want one positive duration such as 250ms)"
			}
			budget = min(d, c.cfg.MaxDeadline) // the server never waits longer than its max
		}
	}
	return budget, ""
}

// validToken reports whether s is 1 to max visible ASCII characters.
func validToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// parseCount parses a non-negative decimal integer of at most 18 digits.
func parseCount(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	n := int64(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// validRequestID reports whether a client-supplied request id may be echoed.
func validRequestID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}
