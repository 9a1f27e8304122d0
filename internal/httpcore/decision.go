package httpcore

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
)

// Defaults of DecisionConfig: the headers an nginx auth_request location
// sets with proxy_set_header.
const (
	DefaultMethodHeader = "X-Original-Method"
	DefaultURIHeader    = "X-Original-Uri"
)

// DecisionConfig is httpgate.DecisionConfig (documented there).
type DecisionConfig struct {
	MethodHeader string
	URIHeader    string
	StripPrefix  string
}

// decider is the handler DecisionHandler returns.
type decider struct {
	m            *Middleware
	methodHeader string
	uriHeader    string
	prefix       string
}

// func is httpgate's (documented there).
func (m *Middleware) DecisionHandler(cfg DecisionConfig) (http.Handler, error) {
	d := &decider{m: m, methodHeader: DefaultMethodHeader, uriHeader: DefaultURIHeader}
	if cfg.StripPrefix != "" {
		p := cfg.StripPrefix
		if p[0] != '/' || strings.HasSuffix(p, "/") || strings.ContainsAny(p, "?#") {
			return nil, fmt.Errorf("httpgate: strip prefix %q: want a path that starts with / and does not end with one, e.g. /ext_authz", p)
		}
		d.prefix = p
		return d, nil
	}
	for _, h := range []*string{&cfg.MethodHeader, &cfg.URIHeader} {
		if *h == "" {
			continue
		}
		if !ValidToken(*h) {
			return nil, fmt.Errorf("httpgate: %q is not a valid header name", *h)
		}
	}
	if cfg.MethodHeader != "" {
		d.methodHeader = http.CanonicalHeaderKey(cfg.MethodHeader)
	}
	if cfg.URIHeader != "" {
		d.uriHeader = http.CanonicalHeaderKey(cfg.URIHeader)
	}
	return d, nil
}

// ServeHTTP answers one decision request (see DecisionHandler).
func (d *decider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in, detail := d.original(r)
	if detail != "" {
		d.m.Invalid(w, r, detail)
		return
	}
	d.m.decide(w, r, &in)
}

// original returns the original request's method, path and query, with
// r's header and peer, or a detail naming what is missing or malformed.
// The peer is the proxy asking (nginx, Envoy): a tenant keyed by client
// IP needs it among identity.client_ip.trusted_proxies, and its
// X-Forwarded-For passed along.
func (d *decider) original(r *http.Request) (in identify.Input, detail string) {
	in = identify.Input{Header: r.Header, RemoteAddr: r.RemoteAddr}
	if d.prefix != "" {
		p, ok := strings.CutPrefix(r.URL.Path, d.prefix)
		if !ok || (p != "" && p[0] != '/') {
			return in, "the path does not start with " + d.prefix + "/ (Envoy's path_prefix)"
		}
		if p == "" {
			p = "/"
		}
		in.Method, in.Path, in.RawQuery = r.Method, p, r.URL.RawQuery
		return in, ""
	}
	ms := r.Header[d.methodHeader]
	switch {
	case len(ms) == 0:
		return in, "missing " + d.methodHeader + " header (the original request's method)"
	case len(ms) > 1 || !ValidToken(ms[0]):
		return in, "malformed " + d.methodHeader + " header (want one method, e.g. GET)"
	}
	us := r.Header[d.uriHeader]
	switch {
	case len(us) == 0:
		return in, "missing " + d.uriHeader + " header (the original request's URI)"
	case len(us) > 1:
		return in, "more than one " + d.uriHeader + " header"
	}
	// The request target as the client sent it, parsed as net/http parses
	// a request line, so the path is the one the proxy would see.
	u, err := url.ParseRequestURI(us[0])
	if err != nil {
		return in, "malformed " + d.uriHeader + " header (want the request target, e.g. /v1/routes?x=1)"
	}
	in.Method, in.Path, in.RawQuery = ms[0], u.Path, u.RawQuery
	return in, ""
}

// decide identifies and decides the original request in (its headers are
// r's) and answers it: 200 with the quota fields when admitted, releasing
// the Ticket first, or the rejection.
func (m *Middleware) decide(w http.ResponseWriter, r *http.Request, in *identify.Input) {
	st := m.state.Load()
	req := m.reqs.Get().(*sluice.Request)
	*req = sluice.Request{}
	defer m.reqs.Put(req)
	budget, detail := st.c.id.IdentifyInput(in, req)
	if detail == "" && st.c.cfg.TenantKey != nil {
		detail = tenantKey(st.c.cfg.TenantKey, r, req)
	}
	if detail != "" {
		d := st.chain.Refuse(req, sluice.Decision{Reason: sluice.ReasonInvalid})
		rid := m.reject(w, r, st, &d, req, detail)
		if al := st.c.cfg.AccessLog; al != nil {
			m.logRejected(al, st.chain.Clock().Now(), r, in.Method, in.Path, req, &d, wire.Status(&d), rid, 0)
		}
		return
	}
	ctx := r.Context()
	if budget > 0 {
		req.Deadline = st.chain.Clock().Now().Add(budget)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	from := st.waitFrom()
	dec, tk := st.chain.Decide(ctx, req)
	al := st.c.cfg.AccessLog
	var end clock.Instant
	if al != nil {
		end = st.chain.Clock().Now() // the decision's end, before the answer is written
	}
	if !dec.Admitted {
		rid := m.reject(w, r, st, &dec, req, "")
		if al != nil {
			m.logRejected(al, end, r, in.Method, in.Path, req, &dec, wire.Status(&dec), rid, waited(from, end))
		}
		return
	}
	// Nothing reports when the work ends: the decision is the whole request.
	if r.Context().Err() != nil {
		tk.Done(sluice.OutcomeCancelled)
	} else {
		tk.Done(sluice.OutcomeUseful)
	}
	h := w.Header()
	if !st.c.cfg.NoRateLimitHeaders && !st.c.cfg.HideCapacity {
		m.admittedHeaders(h, st, &dec)
	}
	if dec.Level != sluice.LevelNormal {
		h[hLevel] = levelValues[dec.Level]
	}
	h[sluice.ClassHeader] = []string{req.Class}
	h[hContentLength] = zeroLength
	w.WriteHeader(http.StatusOK)
	if al != nil {
		logAdmitted(al, 0, r, in.Method, in.Path, req, http.StatusOK, waited(from, end))
	}
}

const hContentLength = "Content-Length"

var zeroLength = []string{"0"}

// ValidToken reports whether s is an HTTP token (RFC 9110 tchar), as
// methods and field names are.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}
