package httpgate

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/wire"
)

// Config is how the middleware identifies a request and renders a decision.
// The zero value is valid: one anonymous tenant, class "default", cost 1,
// no deadline header, RateLimit fields on, default jitter.
type Config struct {
	// TenantHeader names the header that identifies the tenant (e.g. the
	// API key). Empty: every request belongs to the anonymous tenant "".
	// The value is used only as a state key: never echoed, never logged.
	TenantHeader string
	// RequireTenant rejects requests without TenantHeader as invalid (400).
	RequireTenant bool
	// DeadlineHeader names the header carrying the caller's remaining time
	// budget as a Go duration ("250ms"). The deadline bounds the handler's
	// context and decides late completions.
	DeadlineHeader string
	// DefaultDeadline is the budget of requests without DeadlineHeader
	// (0: none), so no admitted request holds its permits forever.
	DefaultDeadline time.Duration
	// MaxDeadline caps DeadlineHeader values: a longer budget is clamped to
	// it (the server works no longer than that). Default 5 minutes.
	MaxDeadline time.Duration
	// Routes assign server-side class and cost by method and path; the
	// first match wins. A client can never raise its own priority.
	Routes []Route
	// DefaultClass is the class of requests no route matches. Default
	// sluice.ClassDefault.
	DefaultClass string
	// RequestIDHeader names the header a request id is read from and
	// echoed in (generated when absent or malformed). Default "X-Request-Id".
	RequestIDHeader string
	// NoRateLimitHeaders turns off RateLimit-Policy and RateLimit fields.
	NoRateLimitHeaders bool
	// LegacyHeaders adds X-RateLimit-Limit, -Remaining and -Reset (reset in
	// delay-seconds) to the draft fields.
	LegacyHeaders bool
	// HideCapacity leaves quota figures out of headers and messages: the
	// reason, gate and retry time stay, so callers still know what to do.
	HideCapacity bool
	// Jitter spreads Retry-After values. Nil: wire.DefaultJitter; a zero
	// Jitter turns it off (exact values, for tests).
	Jitter *wire.Jitter
}

// Route is one server-side rule: requests matching Method and Path get
// Class and Cost.
type Route struct {
	// Method matches the request method; empty matches any.
	Method string
	// Path is an exact path, or segments where "*" matches one segment and
	// a final "*" matches one or more, e.g. "/v1/routes/*".
	Path string
	// Class is the server-authorized class; empty: Config.DefaultClass.
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
	// value is rejected as invalid (400).
	Header string
	// Per is the header value per demand unit. Default 1.
	Per int64
	// Min and Max bound the cost from Header. Defaults 1 and
	// sluice.MaxCost.
	Min, Max int64
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
	return nil
}

// compile validates cfg, fills defaults, and returns the compiled form.
func (cfg Config) compile() (*compiled, error) {
	if cfg.MaxDeadline == 0 {
		cfg.MaxDeadline = 5 * time.Minute
	}
	if cfg.MaxDeadline < 0 || cfg.DefaultDeadline < 0 {
		return nil, errors.New("httpgate: negative deadline bound")
	}
	if cfg.DefaultClass == "" {
		cfg.DefaultClass = sluice.ClassDefault
	}
	if cfg.RequestIDHeader == "" {
		cfg.RequestIDHeader = "X-Request-Id"
	}
	if cfg.Jitter == nil {
		j := wire.DefaultJitter
		cfg.Jitter = &j
	}
	c := &compiled{cfg: cfg}
	c.tenantHeader = http.CanonicalHeaderKey(cfg.TenantHeader)
	c.deadlineHeader = http.CanonicalHeaderKey(cfg.DeadlineHeader)
	c.requestIDHeader = http.CanonicalHeaderKey(cfg.RequestIDHeader)
	c.fallback = route{class: cfg.DefaultClass, op: "other", cost: Cost{Fixed: 1, Per: 1, Min: 1, Max: sluice.MaxCost}}
	for i, r := range cfg.Routes {
		if r.Path == "" || r.Path[0] != '/' {
			return nil, fmt.Errorf("httpgate: route %d: path %q must start with /", i, r.Path)
		}
		if err := r.Cost.normalize(); err != nil {
			return nil, fmt.Errorf("httpgate: route %d (%s): %v", i, r.Path, err)
		}
		if r.Class == "" {
			r.Class = cfg.DefaultClass
		}
		op := r.Path
		if r.Method != "" {
			op = strings.ToUpper(r.Method) + " " + r.Path
		}
		c.routes = append(c.routes, route{method: strings.ToUpper(r.Method), pattern: r.Path, class: r.Class, op: op, cost: r.Cost})
	}
	return c, nil
}

type compiled struct {
	cfg             Config
	tenantHeader    string
	deadlineHeader  string
	requestIDHeader string
	routes          []route
	fallback        route
}

type route struct {
	method  string
	pattern string
	class   string
	op      string
	cost    Cost
}

// match returns the first route matching method and path.
func (c *compiled) match(method, path string) *route {
	for i := range c.routes {
		r := &c.routes[i]
		if (r.method == "" || r.method == method) && matchPath(r.pattern, path) {
			return r
		}
	}
	return &c.fallback
}

// matchPath matches path against pattern segment by segment: "*" matches
// one non-empty segment, and a final "*" matches one or more. It does not
// allocate.
func matchPath(pattern, path string) bool {
	pattern = strings.TrimPrefix(pattern, "/")
	path = strings.TrimPrefix(path, "/")
	for {
		pseg, prest, pmore := strings.Cut(pattern, "/")
		seg, rest, more := strings.Cut(path, "/")
		switch {
		case pseg == "*" && !pmore:
			return seg != ""
		case pseg == "*":
			if seg == "" {
				return false
			}
		case pseg != seg:
			return false
		}
		if !pmore || !more {
			return pmore == more
		}
		pattern, path = prest, rest
	}
}

// Classify applies cfg's identification rules to a request described by
// method, path and header, exactly as the middleware would, and returns the
// Request (tenant, class, operation, cost; no deadline) and the caller's
// time budget (0: none). It is for tools that decide outside an HTTP server,
// such as the simulator. It returns an error for an invalid cfg or a
// malformed header.
func Classify(cfg Config, method, path string, header http.Header) (sluice.Request, time.Duration, error) {
	c, err := cfg.compile()
	if err != nil {
		return sluice.Request{}, 0, err
	}
	if header == nil {
		header = http.Header{}
	}
	r := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: header}
	var req sluice.Request
	budget, detail := c.identify(r, &req)
	if detail != "" {
		return sluice.Request{}, 0, errors.New("httpgate: " + detail)
	}
	return req, budget, nil
}
