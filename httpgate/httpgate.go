package httpgate

import (
	"log/slog"
	"net/http"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/httpcore"
)

// Config is how the middleware identifies a request (the server-side rules
// of package identify: tenant header, routes with class and cost, deadline
// header, request id header) and renders a decision. The zero value is
// valid: one anonymous tenant, class "default", cost 1, no deadline header,
// RateLimit fields on, default jitter.
type Config struct {
	identify.Rules
	// TenantKey, if set, computes the tenant in place of the rules' tenant
	// parts (which must then be unset), e.g. a function of identify.Key or
	// one's own. An error answers 400 with its text; a key over
	// sluice.MaxKeyLen bytes is hashed (identify.BoundKey). Behind a
	// decision handler it is given the check request (the original's
	// headers, the asking proxy's address).
	TenantKey identify.KeyFunc
	// NoRateLimitHeaders turns off RateLimit-Policy and RateLimit fields.
	NoRateLimitHeaders bool
	// LegacyHeaders adds X-RateLimit-Limit, -Remaining and -Reset (reset in
	// delay-seconds) to the draft fields, on every answer that has them,
	// a 429 included (its Reset is its RateLimit's t).
	LegacyHeaders bool
	// HideCapacity leaves quota figures out of headers and messages: the
	// reason, gate and retry time stay, so callers still know what to do.
	HideCapacity bool
	// Jitter spreads Retry-After values. Nil: sluice.DefaultJitter; a zero
	// Jitter turns it off (exact values, for tests).
	Jitter *sluice.Jitter
	// ProblemDetails answers rejections with an RFC 9457 problem details
	// body (Content-Type application/problem+json; wire.AppendProblem)
	// instead of the JSON envelope. The status, Retry-After and RateLimit
	// fields are the same either way.
	ProblemDetails bool
	// Propagate passes the decision on with an admitted request: its
	// header gets the class it was admitted as (sluice.ClassHeader), the
	// degradation level (sluice.LevelHeader, only above normal) and, with
	// a deadline header in the rules, the time left of its budget (in
	// whole milliseconds, at least 1ms), and loses the client's own values
	// of those fields. Wrap rewrites r.Header before its handler runs (a
	// reverse proxy forwards them); a server of the exchange API calls
	// Admission.Propagate on the request it sends. Off, the handler still
	// finds class and level in the request's context (sluice.ClassFrom,
	// sluice.LevelFrom) and the client's fields pass untouched.
	Propagate bool
	// AccessLog, if set, logs admitted requests and a sample of
	// rejections (see AccessLog). Nil: no access log, and nothing spent
	// on one.
	AccessLog *AccessLog
}

// Check reports the error New or Update would return for cfg, without
// making anything: a caller that must not fail after a point (a reload
// that has stopped the gates it replaces) checks first.
func (cfg Config) Check() error { return cfg.core().Check() }

// core is cfg as the implementation takes it.
func (cfg Config) core() httpcore.Config {
	return httpcore.Config{Rules: cfg.Rules, TenantKey: cfg.TenantKey, NoRateLimitHeaders: cfg.NoRateLimitHeaders,
		LegacyHeaders: cfg.LegacyHeaders, HideCapacity: cfg.HideCapacity, Jitter: cfg.Jitter, ProblemDetails: cfg.ProblemDetails,
		Propagate: cfg.Propagate, AccessLog: (*httpcore.AccessLog)(cfg.AccessLog)}
}

// AccessLog is the middleware's optional access log: one line for each
// admitted request when its handler returns (status, duration), and for
// rejections a sample, so that the rejection path stays cheap under the
// overload that makes it hot: in each second of the chain's clock, at most
// RejectsPerSecond lines per reason; the rejections left out are counted
// and the count rides on the next line of that reason (suppressed=N).
//
// Lines carry the method, the path (never the query string, which may hold
// credentials), the remote address, class, operation and cost, and the
// tenant only through TenantLabel (a tenant is often an API key). Where a
// gate of the chain may wait (a wait queue, pacing), a decision that took
// 100 µs or more adds wait: the request arrived that long before it was
// decided, and duration counts from the decision (sluice whatif replays
// it at its arrival).
type AccessLog struct {
	// Logger receives the lines, at info level, message "request".
	// Required.
	Logger *slog.Logger
	// RejectsPerSecond is how many rejections of each reason are logged
	// per second. Default 1; negative: every rejection.
	RejectsPerSecond int
	// TenantLabel, if set, turns a tenant into what the lines show (say a
	// hash, as package metrics labels tenants); nil leaves tenants out.
	TenantLabel func(tenant string) string
}

// Defaults of DecisionConfig: the headers an nginx auth_request location
// sets with proxy_set_header.
const (
	DefaultMethodHeader = "X-Original-Method"
	DefaultURIHeader    = "X-Original-Uri"
)

// DecisionConfig says where a decision handler finds the original request
// in the request it is asked about. The zero value is nginx's form.
//
// Two forms exist:
//
//   - Headers (nginx auth_request): the original method and request URI
//     arrive in MethodHeader and URIHeader, which the auth location sets
//     from $request_method and $request_uri; the request's own method and
//     path are the decision endpoint's and are ignored.
//   - Prefix (Envoy ext_authz in HTTP service mode): the check request
//     carries the original method as its own and the original path behind
//     Envoy's path_prefix. Set StripPrefix to that prefix.
//
// In both forms every other header of the request is the original
// request's: the tenant, deadline, cost and request id headers of the
// policy are read from it as the middleware reads them. The client's
// address is no input of the middleware's decisions (callers are told
// apart by the tenant header, never by the connection): to key tenants on
// the address, the proxy sets a header from it (nginx: proxy_set_header
// X-Real-IP $remote_addr) and the rules name it as the tenant header, as
// they would behind any other proxy.
type DecisionConfig struct {
	// MethodHeader names the header with the original request's method.
	// Default DefaultMethodHeader.
	MethodHeader string
	// URIHeader names the header with the original request target as the
	// client sent it (origin form "/path?query", or absolute form);
	// only its path is used. Default DefaultURIHeader.
	URIHeader string
	// StripPrefix, when set, selects the prefix form: the original method
	// is the request's method and the original path is the request's path
	// with StripPrefix removed. It must start with "/" and not end with
	// one, e.g. "/ext_authz"; MethodHeader and URIHeader are not read.
	StripPrefix string
}

// Middleware runs a sluice Chain in front of an http.Handler: it identifies
// each request with server-side rules (Config), decides, and either answers
// the rejection itself (400, 429 or 503 with Retry-After, RateLimit fields
// and a JSON envelope) or calls the handler with the caller's deadline on
// its context and releases the request's Ticket on every path: return,
// panic (released, then the panic continues), client disconnect (cancelled)
// and handler timeout (late). A response finished after the request's
// deadline counts as late, never as useful.
//
// The chain and config can be replaced at run time with Update (hot reload)
// without disturbing requests in flight. A Middleware is safe for
// concurrent use.
type Middleware struct {
	c *httpcore.Middleware
}

// New returns a middleware deciding with chain under cfg.
func New(chain *sluice.Chain, cfg Config) (*Middleware, error) {
	c, err := httpcore.New(chain, cfg.core())
	if err != nil {
		return nil, err
	}
	return &Middleware{c: c}, nil
}

// Update replaces the chain and config atomically. Requests already past
// their decision finish under the old chain (their Tickets release there).
func (m *Middleware) Update(chain *sluice.Chain, cfg Config) error {
	return m.c.Update(chain, cfg.core())
}

// Chain returns the chain currently deciding.
func (m *Middleware) Chain() *sluice.Chain { return m.c.Chain() }

// Wrap returns next behind the middleware.
func (m *Middleware) Wrap(next http.Handler) http.Handler { return m.c.Wrap(next) }

// DecisionHandler returns a handler that answers, for each request it
// receives, whether the original request it describes is admitted: it
// reconstructs the original method and path (DecisionConfig), identifies
// and decides exactly as the middleware would (same chain, same rules,
// same Update), and answers
//
//   - 200 with an empty body and the RateLimit-Policy and RateLimit fields,
//     Sluice-Class (the class it admitted the request as, for the proxy to
//     set on the request it forwards: nginx's auth_request_set and
//     proxy_set_header) and Sluice-Level above normal when admitted: nginx
//     allows on any 2xx, Envoy's ext_authz on 200 only;
//   - 429 or 503 with Retry-After, the RateLimit fields and the JSON
//     envelope, as the middleware answers them (nginx drops the body and
//     keeps the status and headers for auth_request_set; Envoy passes all
//     of it to the client);
//   - 400 with reason invalid and a message naming the header at fault for
//     a missing or malformed original method or URI, or a malformed
//     identity, cost or deadline header.
//
// A decision endpoint never learns when the admitted work ends (nginx
// auth_request and Envoy ext_authz report nothing back), so the Ticket of
// an admitted request is done before the answer is written, with
// OutcomeUseful (OutcomeCancelled when the asking request has gone):
// rate gates (token and leaky buckets, GCRA, windows) decide exactly as in
// process, but a gate that holds a slot until the work ends or learns from
// completions (concurrency, adaptive concurrency, wait queues, the
// deadline test, fleet usage, utilization, the ladder) sees every request
// finish at once and must not be in the chain (policy.CheckDecisionOnly
// finds them in a policy file). The middleware's metrics then count
// answered decisions as completions.
//
// It returns an error for a header name that is not a valid HTTP field
// name or a malformed StripPrefix. The handler is safe for concurrent use
// and never panics on what a request carries.
func (m *Middleware) DecisionHandler(cfg DecisionConfig) (http.Handler, error) {
	return m.c.DecisionHandler(httpcore.DecisionConfig(cfg))
}

// UpstreamError answers an admitted request whose upstream call failed with
// err (it fits httputil.ReverseProxy's ErrorHandler): 504 with reason
// deadline when the request's deadline ran out, 502 with reason upstream
// otherwise, both saying the work may have had an effect, in the JSON
// envelope of every other answer, with the request id echoed or generated
// in the configured header. Nothing is written when the client has gone.
func (m *Middleware) UpstreamError(w http.ResponseWriter, r *http.Request, err error) {
	m.c.UpstreamError(w, r, err)
}

// Invalid answers a request the caller got wrong before it reached the
// gates (for example a method the proxy does not forward): 400 with reason
// invalid and detail as the message, in the JSON envelope of every other
// answer.
func (m *Middleware) Invalid(w http.ResponseWriter, r *http.Request, detail string) {
	m.c.Invalid(w, r, detail)
}

// InvalidStatus answers as Invalid does, with status instead of 400 in
// the status line and in a problem details body: for a request refused
// for its size, 413 Content Too Large (RFC 9110 section 15.5.14) or 431
// Request Header Fields Too Large (RFC 6585 section 5). A status outside
// 400-499 is answered as 400.
func (m *Middleware) InvalidStatus(w http.ResponseWriter, r *http.Request, status int, detail string) {
	m.c.InvalidStatus(w, r, status, detail)
}

// Busy answers 503 with Retry-After (reason overload, the JSON envelope or
// problem details, the request id) to a request the server has no room
// for, whatever the gates would say: a proxy whose shared body buffers
// are spent (detail says which). It is counted and logged as a
// rejection, as the gates' are.
func (m *Middleware) Busy(w http.ResponseWriter, r *http.Request, detail string) {
	m.c.Busy(w, r, detail)
}
