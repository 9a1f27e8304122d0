package httpgate

import (
	"errors"

	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/wire"
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
	// delay-seconds) to the draft fields.
	LegacyHeaders bool
	// HideCapacity leaves quota figures out of headers and messages: the
	// reason, gate and retry time stay, so callers still know what to do.
	HideCapacity bool
	// Jitter spreads Retry-After values. Nil: wire.DefaultJitter; a zero
	// Jitter turns it off (exact values, for tests).
	Jitter *wire.Jitter
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

// compiled is a Config with its rules compiled and defaults filled in.
type compiled struct {
	cfg Config
	id  *identify.Identifier
}

// Check reports the error New or Update would return for cfg, without
// making anything: a caller that must not fail after a point (a reload
// that has stopped the gates it replaces) checks first.
func (cfg Config) Check() error {
	_, err := cfg.compile()
	return err
}

func (cfg Config) compile() (*compiled, error) {
	if cfg.TenantKey != nil && (cfg.TenantHeader != "" || len(cfg.Tenant.Parts) > 0) {
		return nil, errors.New("httpgate: TenantKey and the rules' tenant both set")
	}
	id, err := identify.New(cfg.Rules)
	if err != nil {
		return nil, err
	}
	if cfg.Jitter == nil {
		j := wire.DefaultJitter
		cfg.Jitter = &j
	}
	cfg.Rules = id.Rules()
	return &compiled{cfg: cfg, id: id}, nil
}
