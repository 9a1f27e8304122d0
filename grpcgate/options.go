package grpcgate

import (
	"net/http"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
)

// Options are how the interceptors identify a call (the rules of package
// identify, read as the package documentation says: header names are
// metadata keys, route paths full method names) and render a decision. The
// zero value is valid: one anonymous tenant, class "default", cost 1, the
// call's own deadline, RateLimit metadata on, default jitter.
type Options struct {
	identify.Rules
	// NoRateLimitMetadata turns off the ratelimit and ratelimit-policy
	// trailers.
	NoRateLimitMetadata bool
	// NoStatusDetails leaves the ErrorInfo and RetryInfo details out of
	// refusals' statuses: the code, message and trailer still say it all,
	// and a refusal costs less (marshalling and decoding the details is
	// about a fifth of a refused call over loopback; see BENCHMARKS.md).
	NoStatusDetails bool
	// HideCapacity leaves quota figures out of metadata and messages: the
	// reason, gate and retry time stay, so callers still know what to do.
	HideCapacity bool
	// Jitter spreads pushback values (see the package documentation). Nil:
	// sluice.DefaultJitter; a zero Jitter turns it off (exact values, for
	// tests).
	Jitter *sluice.Jitter
}

// mdKey is a metadata key read for identification, with the canonical
// header name the identify rules look it up under.
type mdKey struct {
	md, canon string
}

// compiled is Options with the rules compiled and defaults filled in.
type compiled struct {
	opts   Options
	id     *identify.Identifier
	jitter sluice.Jitter
	keys   []mdKey // tenant, cost and request id keys
	ridKey string  // request id metadata key
}

func (o Options) compile() (*compiled, error) {
	id, err := identify.New(o.Rules)
	if err != nil {
		return nil, err
	}
	c := &compiled{id: id}
	o.Rules = id.Rules()
	if o.Jitter == nil {
		c.jitter = sluice.DefaultJitter
	} else {
		c.jitter = *o.Jitter
	}
	c.opts = o
	seen := map[string]bool{}
	add := func(name string) {
		canon := http.CanonicalHeaderKey(name)
		if name == "" || seen[canon] {
			return
		}
		seen[canon] = true
		c.keys = append(c.keys, mdKey{md: strings.ToLower(name), canon: canon})
	}
	add(o.TenantHeader)
	for _, h := range id.TenantHeaders() {
		add(h)
	}
	for _, rt := range o.Routes {
		add(rt.Cost.Header)
	}
	if len(o.Peers.Trusted) > 0 {
		add(sluice.ClassHeader) // believed from the trusted peers only (identify.Peers)
	}
	add(id.RequestIDHeader())
	c.ridKey = strings.ToLower(id.RequestIDHeader())
	return c, nil
}
