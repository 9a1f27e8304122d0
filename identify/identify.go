// Package identify turns a request's method, path, headers, query and peer
// address into a sluice.Request with server-side rules only: the tenant
// from a header, a query parameter, a bearer token's claim, the client's IP
// address or the route (or several of them), class, operation and cost
// from route rules, and the caller's time budget from a deadline header. A
// client can never raise its own priority: classes come from the routes,
// never from what the client sends.
//
//	id, err := identify.New(identify.Rules{
//		TenantHeader:   "X-Api-Key",
//		DeadlineHeader: "X-Request-Timeout",
//		Routes: []identify.Route{
//			{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical,
//				Cost: identify.Cost{Header: "X-Stops", Per: 100, Min: 1, Max: 50}},
//			{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
//		},
//	})
//	var req sluice.Request
//	budget, detail := id.IdentifyRequest(r, &req)
//
// # Keys
//
// A tenant key is a state key: it names a bucket or a counter in the
// store, is never logged or echoed, and is at most sluice.MaxKeyLen bytes
// (a longer composite key is replaced by its SHA-256, BoundKey). KeyRules
// say where it comes from; Key compiles them into a KeyFunc on its own, for
// httpgate.Config.TenantKey or any other use.
//
// The client's IP address (ClientIP) is the peer's, or, from a configured
// trusted proxy, the right-most address of X-Forwarded-For or of the RFC
// 7239 Forwarded header that is not itself a trusted proxy: what a client
// writes in those headers never decides its key unless a proxy of ours
// vouches for it. IPv6 clients are grouped by prefix (a /64 by default),
// IPv4-mapped IPv6 addresses count as IPv4.
//
// A claim is read from a JWT (RFC 7519) bearer token without verifying its
// signature: sluice reads claims of tokens that an authenticator in front
// of it has verified (see Token).
//
// The HTTP middleware (package httpgate), the policy file (package policy)
// and the simulator share these rules, so a request is identified the same
// way wherever it is decided.
package identify

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
)

// Defaults of Rules.
const (
	// DefaultMaxDeadline caps the budget a caller may ask for.
	DefaultMaxDeadline = 5 * time.Minute
	// DefaultRequestIDHeader is where a request id is read from and echoed.
	DefaultRequestIDHeader = "X-Request-Id"
)

// Rules identify requests. The zero value is valid: one anonymous tenant,
// class "default", operation "other", cost 1, no deadline.
type Rules struct {
	// TenantHeader names the header that identifies the tenant (e.g. the
	// API key). Empty: every request belongs to the anonymous tenant "".
	// The value is used only as a state key: never echoed, never logged.
	TenantHeader string
	// RequireTenant refuses requests without TenantHeader, or without a
	// part of Tenant, as invalid.
	RequireTenant bool
	// Tenant, when it has parts, derives the tenant key from them: a
	// header, a query parameter, a bearer token's claim, the client's IP
	// address, the route, or several of them (see KeyRules). TenantHeader
	// must then be empty: it is the shorthand for one header part.
	Tenant KeyRules
	// DeadlineHeader names the header carrying the caller's remaining time
	// budget as a Go duration ("250ms").
	DeadlineHeader string
	// DefaultDeadline is the budget of requests without DeadlineHeader
	// (0: none), so that no admitted request holds its permits forever.
	DefaultDeadline time.Duration
	// MaxDeadline caps every budget: a longer one is clamped to it (the
	// server works no longer than that). Default DefaultMaxDeadline.
	MaxDeadline time.Duration
	// Routes assign class, operation and cost by method and path; the
	// first match wins.
	Routes []Route
	// DefaultClass is the class of requests no route matches. Default
	// sluice.ClassDefault.
	DefaultClass string
	// RequestIDHeader names the header a request id is read from and
	// echoed in. Default DefaultRequestIDHeader.
	RequestIDHeader string
	// PathMatch is how request paths are compared with route paths.
	// Default PathLenient.
	PathMatch PathMatch
	// ClientKey fills Request.Client with the client's address, found by
	// Client and grouped by its prefixes, for gates counted per client
	// (sluice.ScopeClient). A request whose address cannot be read gets
	// the empty client.
	ClientKey bool
	// Client finds the client's address for ClientKey.
	Client ClientIP
	// Peers are the other sluice instances whose class header
	// (sluice.ClassHeader) lowers a request's class. None: it is never
	// read.
	Peers Peers
}

// PathMatch is a rule for comparing a request path with a route's path.
// Route matching must be no weaker than the upstream's own routing, or a
// client reaches a handler under a class that is not its own: most
// routers (Express, Rails, Spring, ASP.NET) match case-insensitively,
// ignore a trailing slash, and some collapse duplicate slashes or dot
// segments, so the default is lenient.
type PathMatch uint8

const (
	// PathLenient resolves dot segments ("/a/./b/../c" is "/a/c"),
	// collapses duplicate slashes, ignores a trailing slash and compares
	// segments ignoring ASCII case (not Unicode case: "K", the Kelvin
	// sign, is not "k"). Percent-encoding is decoded once, as
	// net/http does for URL.Path (so "/v1/%61nalytics" is
	// "/v1/analytics"). A segment's ;parameters (RFC 3986 section 3.3,
	// which Tomcat, Jetty and Spring drop before routing) are ignored:
	// "/v1/analytics;jsessionid=1/daily" is "/v1/analytics/daily".
	PathLenient PathMatch = iota
	// PathExact compares the decoded path segment by segment as written.
	PathExact
)

var pathMatchNames = [...]string{"lenient", "exact"}

// String returns "lenient" or "exact".
func (m PathMatch) String() string {
	if int(m) < len(pathMatchNames) {
		return pathMatchNames[m]
	}
	return "unknown"
}

// ParsePathMatch parses "lenient" or "exact". The error lists the names.
func ParsePathMatch(s string) (PathMatch, error) {
	for i, n := range pathMatchNames {
		if n == s {
			return PathMatch(i), nil
		}
	}
	return 0, fmt.Errorf("identify: path match %q is not one of %s", s, strings.Join(pathMatchNames[:], ", "))
}

// Route is one server-side rule: requests matching Method and Path get
// Class and Cost, and the operation "METHOD PATH" (or "PATH" for any
// method).
type Route struct {
	// Method matches the request method; empty matches any.
	Method string
	// Path is an exact path, or segments where "*" matches one segment and
	// a final "*" matches one or more, e.g. "/v1/routes/*".
	Path string
	// Class is the server-authorized class; empty: Rules.DefaultClass.
	Class string
	// Cost is the demand of a matching request.
	Cost Cost
}

// Cost is how much of the scarce resource a request consumes, in demand
// units. The zero Cost is 1 unit.
type Cost struct {
	// Fixed is the cost when Header is empty or absent. Default 1.
	Fixed int64
	// Header, if set, names a request header whose non-negative integer
	// value sets the cost: ⌈value / Per⌉, clamped to [Min, Max]. A malformed
	// value makes the request invalid.
	Header string
	// Per is the header value per demand unit. Default 1.
	Per int64
	// Min and Max bound the cost from Header. Defaults 1 and
	// sluice.MaxCost.
	Min, Max int64
	// ResponseHeader, if set, names a header of the answer with the work's
	// actual cost, the same quantity Header declares (⌈value / Per⌉,
	// clamped to [Min, Max]): see Identifier.ActualCost. Without Header,
	// the estimate is Min. Behind httpgate it is read when the handler
	// returns, so a trailer (declared in the Trailer field) carries a cost
	// known only after the body.
	ResponseHeader string
}

func (c *Cost) normalize() error {
	if c.Fixed == 0 {
		c.Fixed = 1
	}
	if c.Per == 0 {
		c.Per = 1
	}
	if c.Min == 0 {
		c.Min = 1
	}
	if c.Max == 0 {
		c.Max = sluice.MaxCost
	}
	switch {
	case c.Fixed < 1 || c.Fixed > sluice.MaxCost:
		return fmt.Errorf("cost %d outside [1, %d]", c.Fixed, int64(sluice.MaxCost))
	case c.Per < 1:
		return fmt.Errorf("cost per %d, want ≥ 1", c.Per)
	case c.Min < 1 || c.Max > sluice.MaxCost || c.Min > c.Max:
		return fmt.Errorf("cost bounds [%d, %d] invalid", c.Min, c.Max)
	}
	if c.Header != "" {
		c.Header = http.CanonicalHeaderKey(c.Header)
	}
	if c.ResponseHeader != "" {
		c.ResponseHeader = http.CanonicalHeaderKey(c.ResponseHeader)
		if c.Header == "" {
			c.Fixed = max(c.Fixed, c.Min)
		}
	}
	return nil
}

// Identifier is a compiled set of Rules. It is immutable and safe for
// concurrent use.
type Identifier struct {
	rules           Rules // defaults filled in
	deadlineHeader  string
	requestIDHeader string
	routes          []route
	fallback        route
	actual          map[string]*Cost // by operation: the routes whose answer tells the actual cost
	tenant          *keyer           // nil: every request is the anonymous tenant
}

type route struct {
	method  string
	pattern string
	class   string
	op      string
	cost    Cost
}

// New validates r, fills in its defaults and compiles it. It returns an
// error naming the route at fault for a path that does not start with "/"
// or a cost outside its bounds, and for negative deadline bounds.
func New(r Rules) (*Identifier, error) {
	if r.MaxDeadline == 0 {
		r.MaxDeadline = DefaultMaxDeadline
	}
	if r.MaxDeadline < 0 || r.DefaultDeadline < 0 {
		return nil, errors.New("identify: negative deadline bound")
	}
	if r.PathMatch.String() == "unknown" {
		return nil, fmt.Errorf("identify: unknown path match %d", r.PathMatch)
	}
	if r.DefaultClass == "" {
		r.DefaultClass = sluice.ClassDefault
	}
	if r.RequestIDHeader == "" {
		r.RequestIDHeader = DefaultRequestIDHeader
	}
	r.Routes = append([]Route(nil), r.Routes...)
	tenant, err := tenantKeyer(&r)
	if err != nil {
		return nil, err
	}
	if r.ClientKey {
		if err := r.Client.normalize(); err != nil {
			return nil, fmt.Errorf("identify: client: %w", err)
		}
	}
	if err := r.Peers.normalize(); err != nil {
		return nil, fmt.Errorf("identify: peers: %w", err)
	}
	id := &Identifier{
		tenant:          tenant,
		deadlineHeader:  http.CanonicalHeaderKey(r.DeadlineHeader),
		requestIDHeader: http.CanonicalHeaderKey(r.RequestIDHeader),
		fallback:        route{class: r.DefaultClass, op: "other", cost: Cost{Fixed: 1, Per: 1, Min: 1, Max: sluice.MaxCost}},
	}
	for i := range r.Routes {
		rt := &r.Routes[i]
		if rt.Path == "" || rt.Path[0] != '/' {
			return nil, fmt.Errorf("identify: route %d: path %q must start with /", i, rt.Path)
		}
		if err := rt.Cost.normalize(); err != nil {
			return nil, fmt.Errorf("identify: route %d (%s): %v", i, rt.Path, err)
		}
		if rt.Class == "" {
			rt.Class = r.DefaultClass
		}
		op := rt.Path
		if rt.Method != "" {
			op = strings.ToUpper(rt.Method) + " " + rt.Path
		}
		id.routes = append(id.routes, route{method: strings.ToUpper(rt.Method), pattern: rt.Path, class: rt.Class, op: op, cost: rt.Cost})
	}
	id.actual = actualCosts(id.routes)
	id.rules = r
	return id, nil
}

// actualCosts maps each operation whose route reads the actual cost from
// the answer to that route's cost (nil: none does). The first route of an
// operation is the one that matches.
func actualCosts(routes []route) map[string]*Cost {
	var m map[string]*Cost
	seen := map[string]bool{}
	for i := range routes {
		rt := &routes[i]
		if seen[rt.op] {
			continue
		}
		seen[rt.op] = true
		if rt.cost.ResponseHeader != "" {
			if m == nil {
				m = map[string]*Cost{}
			}
			m[rt.op] = &rt.cost
		}
	}
	return m
}

// tenantKeyer compiles the tenant rules of r (normalizing r.Tenant), or
// returns nil when every request is the anonymous tenant.
func tenantKeyer(r *Rules) (*keyer, error) {
	if r.TenantHeader != "" && len(r.Tenant.Parts) > 0 {
		return nil, errors.New("identify: both TenantHeader and Tenant parts set (TenantHeader is one header part)")
	}
	k := &keyer{rules: r.Tenant}
	if r.TenantHeader != "" {
		k.rules.Parts = []Part{FromHeader(r.TenantHeader)}
	}
	if err := k.rules.normalize(); err != nil {
		return nil, fmt.Errorf("identify: tenant: %v", err)
	}
	r.Tenant.Token, r.Tenant.ClientIP = k.rules.Token, k.rules.ClientIP // defaults filled in
	k.rules.Required = k.rules.Required || r.RequireTenant
	if len(k.rules.Parts) == 0 {
		return nil, nil
	}
	return k, nil
}

// TenantHeaders returns the canonical names of the headers the tenant key
// reads: its header parts, the token header of claim parts and, with
// trusted proxies, the forwarding header of client IP parts. Adapters that
// copy only the headers the rules need (gRPC metadata, Envoy's check
// requests) copy these too.
func (id *Identifier) TenantHeaders() []string {
	if id.tenant == nil {
		return nil
	}
	var hs []string
	r := &id.tenant.rules
	for _, p := range r.Parts {
		switch {
		case p.Source == SourceHeader:
			hs = append(hs, p.Name)
		case p.Source == SourceClaim:
			hs = append(hs, r.Token.Header)
		case p.Source == SourceClientIP && len(r.ClientIP.TrustedProxies) > 0 && r.ClientIP.Header == Forwarded:
			hs = append(hs, "Forwarded")
		case p.Source == SourceClientIP && len(r.ClientIP.TrustedProxies) > 0:
			hs = append(hs, "X-Forwarded-For")
		}
	}
	return hs
}

// Headers returns the canonical names of every header IdentifyInput and
// RequestID read with these rules: the tenant's (TenantHeaders), the
// deadline header, the routes' cost headers and the request id header,
// each once. A server that builds the Input's header from only these
// identifies as it would with the whole header.
func (id *Identifier) Headers() []string {
	var hs []string
	add := func(h string) {
		if h = http.CanonicalHeaderKey(h); h != "" && !slices.Contains(hs, h) {
			hs = append(hs, h)
		}
	}
	for _, h := range id.TenantHeaders() {
		add(h)
	}
	if c := &id.rules.Client; id.rules.ClientKey && len(c.TrustedProxies) > 0 {
		if c.Header == Forwarded {
			add("Forwarded")
		} else {
			add("X-Forwarded-For")
		}
	}
	add(id.deadlineHeader)
	if len(id.rules.Peers.Trusted) > 0 {
		add(sluice.ClassHeader)
	}
	for i := range id.routes {
		add(id.routes[i].cost.Header)
	}
	add(id.requestIDHeader)
	return hs
}

// ReadsClientIP reports whether the tenant key, the client key or the
// trusted peers read the peer's address (Input.RemoteAddr): a server may leave it empty
// otherwise.
func (id *Identifier) ReadsClientIP() bool {
	if id.rules.ClientKey || len(id.rules.Peers.Trusted) > 0 {
		return true
	}
	if id.tenant == nil {
		return false
	}
	for _, p := range id.tenant.rules.Parts {
		if p.Source == SourceClientIP {
			return true
		}
	}
	return false
}

// Rules returns the rules with their defaults filled in.
func (id *Identifier) Rules() Rules { return id.rules }

// RequestIDHeader returns the canonical name of the request id header.
func (id *Identifier) RequestIDHeader() string { return id.requestIDHeader }

// match returns the first route matching method and path.
func (id *Identifier) match(method, path string) *route {
	if len(id.routes) == 0 {
		return &id.fallback
	}
	fold := id.rules.PathMatch == PathLenient
	if fold {
		path = cleanPath(path)
	}
	for i := range id.routes {
		r := &id.routes[i]
		if (r.method == "" || r.method == method) && matchPath(r.pattern, path, fold) {
			return r
		}
	}
	return &id.fallback
}

// cleanPath resolves dot segments, collapses duplicate slashes and drops a
// trailing slash (path.Clean), allocating only for paths that need it.
func cleanPath(p string) string {
	if p == "" || p == "/" {
		return "/"
	}
	if p[0] == '/' && p[len(p)-1] != '/' && !strings.Contains(p, "//") && !strings.Contains(p, "/.") {
		return p
	}
	return path.Clean("/" + p)
}

// equalFold reports whether a and b are equal ignoring ASCII case.
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}

// matchPath matches path against pattern segment by segment: "*" matches
// one non-empty segment, and a final "*" matches one or more; with fold,
// segments compare ignoring ASCII case and their ;parameters. It does not
// allocate.
func matchPath(pattern, path string, fold bool) bool {
	pattern = strings.TrimPrefix(pattern, "/")
	path = strings.TrimPrefix(path, "/")
	for {
		pseg, prest, pmore := strings.Cut(pattern, "/")
		seg, rest, more := strings.Cut(path, "/")
		if fold {
			seg, _, _ = strings.Cut(seg, ";") // a segment's ;parameters
		}
		switch {
		case pseg == "*" && !pmore:
			return seg != ""
		case pseg == "*":
			if seg == "" {
				return false
			}
		case pseg != seg && !(fold && equalFold(pseg, seg)):
			return false
		}
		if !pmore || !more {
			return pmore == more
		}
		pattern, path = prest, rest
	}
}

// Identify fills req (tenant, class, operation, cost; not the deadline)
// from a request's method, path and header with the rules, and returns the
// caller's time budget (0: none). A malformed or missing required header
// yields a non-empty detail naming it, for the caller's 400 message; req is
// then not to be used. It does not allocate. Tenant parts from the query
// or the client's address see none: use IdentifyInput.
func (id *Identifier) Identify(method, path string, h http.Header, req *sluice.Request) (budget time.Duration, detail string) {
	return id.IdentifyInput(&Input{Method: method, Path: path, Header: h}, req)
}

// IdentifyRequest is IdentifyInput of r's method, path, header, query and
// peer address.
func (id *Identifier) IdentifyRequest(r *http.Request, req *sluice.Request) (budget time.Duration, detail string) {
	return id.IdentifyInput(&Input{Method: r.Method, Path: r.URL.Path, Header: r.Header, RawQuery: r.URL.RawQuery, RemoteAddr: r.RemoteAddr}, req)
}

// IdentifyInput is Identify of everything in in. A key of several parts,
// or of a client IP address, allocates; a key of one header does not.
func (id *Identifier) IdentifyInput(in *Input, req *sluice.Request) (budget time.Duration, detail string) {
	method, path, h := in.Method, in.Path, in.Header
	rt := id.match(method, path)
	if id.tenant != nil {
		if req.Tenant, detail = id.tenant.key(in, rt.op); detail != "" {
			return 0, detail
		}
	}
	if id.rules.ClientKey {
		req.Client = ""
		if a, err := id.rules.Client.client(in.RemoteAddr, in.Header); err == nil {
			req.Client = id.rules.Client.key(a)
		}
	}
	req.Class = id.rules.Peers.lower(rt.class, in)
	req.Operation = rt.op
	req.Cost = rt.cost.Fixed
	if name := rt.cost.Header; name != "" {
		if vs := h[name]; len(vs) > 0 {
			v, ok := parseCount(vs[0])
			if !ok || len(vs) > 1 {
				return 0, "malformed " + name + " header (want one non-negative integer)"
			}
			cost := v / rt.cost.Per
			if v%rt.cost.Per != 0 {
				cost++
			}
			req.Cost = min(max(cost, rt.cost.Min), rt.cost.Max)
		}
	}
	budget = min(id.rules.DefaultDeadline, id.rules.MaxDeadline)
	if id.deadlineHeader != "" {
		if vs := h[id.deadlineHeader]; len(vs) > 0 {
			d, err := time.ParseDuration(vs[0])
			if err != nil || len(vs) > 1 || d <= 0 {
				return 0, "malformed " + id.deadlineHeader + " header (want one positive duration such as 250ms)"
			}
			budget = min(d, id.rules.MaxDeadline) // the server never waits longer than its max
		}
	}
	return budget, ""
}

// ActualCost returns the actual cost of a request of operation
// (sluice.Request.Operation) that its answer's header reports (Cost.
// ResponseHeader, read through header): ⌈value / Per⌉ clamped to [Min,
// Max], for Ticket.DoneCost. It returns 0 (keep the estimate) when the
// route reads no such header, or the answer lacks it or holds anything but
// one non-negative integer.
func (id *Identifier) ActualCost(operation string, header func(name string) string) int64 {
	c := id.actual[operation]
	if c == nil {
		return 0
	}
	v, ok := parseCount(header(c.ResponseHeader))
	if !ok {
		return 0
	}
	cost := v / c.Per
	if v%c.Per != 0 {
		cost++
	}
	return min(max(cost, c.Min), c.Max)
}

// RequestID returns the request id the caller sent in the request id
// header, if it may be echoed: one value of 1 to 64 letters, digits and
// "-_.:". Anything else (several values, other bytes, invalid UTF-8) is
// ignored, so an echoed id never needs escaping.
func (id *Identifier) RequestID(h http.Header) (string, bool) {
	vs := h[id.requestIDHeader]
	if len(vs) != 1 || !validRequestID(vs[0]) {
		return "", false
	}
	return vs[0], true
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
