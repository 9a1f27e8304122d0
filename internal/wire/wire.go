// Package wire renders a sluice Decision onto the wire, in one place: the
// HTTP status, Retry-After (delay-seconds with jitter), the RateLimit-Policy
// and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10, the
// legacy X-RateLimit-* fields, and the small fixed-shape JSON rejection
// envelope. Every function appends to a caller's buffer and allocates
// nothing itself.
//
//	secs := wire.RetryAfter(d.RetryAfter, jitter, rand.Uint64())
//	buf = wire.AppendRateLimit(buf, d.Gate, d.Remaining, secs)
package wire

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice"
)

// Draft names the RateLimit header draft this package implements.
const Draft = "draft-ietf-httpapi-ratelimit-headers-10"

// maxSFInt is the largest Integer a Structured Field may carry (RFC 9651).
const maxSFInt = 999_999_999_999_999

// Status returns the HTTP status for a decision: 200 when admitted, 400 for
// invalid requests, 429 for entitlement rejections (RFC 6585: the caller's
// own usage) and 503 for protection rejections (RFC 9110: the service's
// capacity, a deadline it cannot meet, or a failed dependency). Admitted
// work that failed upstream answers 502 (reason upstream) or, when it ran
// out of its deadline, 504 (reason deadline with EffectPossible).
func Status(d *sluice.Decision) int {
	switch {
	case d.Admitted:
		return http.StatusOK
	case d.Reason == sluice.ReasonInvalid:
		return http.StatusBadRequest
	case d.Reason == sluice.ReasonUpstream:
		return http.StatusBadGateway
	case d.Reason == sluice.ReasonDeadline && d.EffectPossible:
		return http.StatusGatewayTimeout
	case d.Entitlement():
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable
}

// Seconds rounds a wait up to whole seconds: 0 for no wait, at least 1 for
// any positive wait (never 0 when a wait is needed).
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(s, maxSFInt)
}

// Jitter is sluice.Jitter (documented there).
type Jitter = sluice.Jitter

// DefaultJitter is sluice.DefaultJitter.
var DefaultJitter = sluice.DefaultJitter

// spread returns j's jitter range in seconds for a base wait.
func spread(j Jitter, base int64) int64 {
	if j.Fraction <= 0 && j.Min <= 0 {
		return 0
	}
	s := int64(float64(base)*j.Fraction + 0.999999)
	return max(s, j.Min, 0)
}

// RetryAfter returns the Retry-After delay-seconds for an exact wait, with
// jitter drawn from rnd (any uniformly random value). 0 means "no header":
// the wait is 0 (retrying cannot help, or there is nothing to wait for).
func RetryAfter(wait time.Duration, j Jitter, rnd uint64) int64 {
	base := Seconds(wait)
	if base == 0 {
		return 0
	}
	if s := spread(j, base); s > 0 {
		base += int64(rnd % uint64(s+1))
	}
	return min(base, maxSFInt)
}

// appendString appends s as a Structured Field String: printable ASCII,
// with `"` and `\` escaped and anything else replaced by '?'.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func appendInt(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, 0), maxSFInt), 10)
}

// appendPolicy appends one RateLimit-Policy member: "name";q=Q;w=W, with
// qu="concurrent-requests" for concurrency quotas (which have no window).
//
// The draft's window is whole seconds, but a policy's window need not be
// (a bucket of burst 50 at 100/s refills in 0.5 s). So the window is
// rounded to whole seconds (at least 1) and the quota scaled to keep the
// sustained rate: q = Quota × w / Window, rounded. Where that differs from
// the burst, the burst follows as the vendor parameter sluice-burst.
func appendPolicy(b []byte, p sluice.Policy) []byte {
	b = appendString(b, p.Name)
	q, w := policyQuota(p)
	b = append(b, ";q="...)
	b = appendInt(b, q)
	if p.Unit == sluice.UnitConcurrentRequests {
		b = append(b, `;qu="concurrent-requests"`...)
	}
	if w > 0 {
		b = append(b, ";w="...)
		b = appendInt(b, w)
	}
	if q != min(max(p.Quota, 0), maxSFInt) {
		b = append(b, ";sluice-burst="...)
		b = appendInt(b, p.Quota)
	}
	return b
}

// policyQuota returns the quota and whole-second window p is advertised
// with (see appendPolicy); w is 0 for policies without a window.
func policyQuota(p sluice.Policy) (q, w int64) {
	if p.Window <= 0 {
		return p.Quota, 0
	}
	w = max(int64((p.Window+time.Second/2)/time.Second), 1)
	if time.Duration(w)*time.Second == p.Window {
		return p.Quota, w
	}
	// q = Quota·w/Window rounded to nearest, in 128 bits, saturating.
	hi, lo := bits.Mul64(uint64(p.Quota), uint64(w)*uint64(time.Second))
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(p.Window)/2, 0)
	hi += carry
	if hi >= uint64(p.Window) {
		return maxSFInt, w
	}
	qq, _ := bits.Div64(hi, lo, uint64(p.Window))
	return min(int64(min(qq, maxSFInt)), maxSFInt), w
}

// AppendPolicies appends a RateLimit-Policy field value listing ps.
func AppendPolicies(b []byte, ps []sluice.Policy) []byte {
	for i, p := range ps {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicy(b, p)
	}
	return b
}

// HasRateLimit reports whether d's quota goes in a RateLimit field: a gate
// with a quota decided it, counted per caller (a quota shared by all
// callers is not advertised to them: sluice.Policy.Scope).
func HasRateLimit(d *sluice.Decision) bool {
	return d.Gate != "" && d.Limit > 0 && d.Scope.PerCaller()
}

// AppendRateLimit appends a RateLimit field member: "name";r=R;t=T, leaving
// t out when t is 0 (nothing to wait for).
func AppendRateLimit(b []byte, name string, remaining, t int64) []byte {
	b = appendString(b, name)
	b = append(b, ";r="...)
	b = appendInt(b, remaining)
	if t > 0 {
		b = append(b, ";t="...)
		b = appendInt(b, t)
	}
	return b
}

// Envelope is the JSON rejection body. It has a fixed shape and small size.
type Envelope struct {
	Reason         sluice.Reason
	Scope          sluice.Scope
	Gate           string
	Retryable      bool
	EffectPossible bool
	RetryAfter     int64 // seconds, 0 when absent
	RequestID      string
	Message        string
}

// AppendEnvelope appends the JSON body:
//
//	{"error":{"reason":"policy_rate","scope":"tenant","gate":"request-rate",
//	 "retryable":true,"effect_possible":false,"retry_after":1,
//	 "request_id":"…","message":"…"}}
func AppendEnvelope(b []byte, e *Envelope) []byte {
	b = append(b, `{"error":{`...)
	b = appendFacts(b, e)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.Message)
	return append(b, "}}\n"...)
}

// appendFacts appends the envelope's members from reason to request_id,
// the part its two shapes (AppendEnvelope, AppendProblem) share.
func appendFacts(b []byte, e *Envelope) []byte {
	b = append(b, `"reason":`...)
	b = appendJSONString(b, e.Reason.String())
	b = append(b, `,"scope":`...)
	b = appendJSONString(b, e.Scope.String())
	b = append(b, `,"gate":`...)
	b = appendJSONString(b, e.Gate)
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, e.Retryable)
	b = append(b, `,"effect_possible":`...)
	b = strconv.AppendBool(b, e.EffectPossible)
	if e.RetryAfter > 0 {
		b = append(b, `,"retry_after":`...)
		b = strconv.AppendInt(b, e.RetryAfter, 10)
	}
	b = append(b, `,"request_id":`...)
	return appendJSONString(b, e.RequestID)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaping quotes, backslashes,
// control characters and invalid UTF-8 (as U+FFFD).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	// Fast path: most strings need no escaping at all.
	clean := 0
	for clean < len(s) && s[clean] >= 0x20 && s[clean] < utf8.RuneSelf && s[clean] != '"' && s[clean] != '\\' {
		clean++
	}
	b = append(b, s[:clean]...)
	for i := clean; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// AppendMessage appends the envelope's human message for a rejection: which
// limit, and when to come back or that retrying cannot help. With hide, the
// quota figures are left out. cost is the request's demand; detail explains
// an invalid request, or what a server without room ran out of.
func AppendMessage(b []byte, d *sluice.Decision, cost, retryAfter int64, hide bool, detail string) []byte {
	switch d.Reason {
	case sluice.ReasonInvalid:
		b = append(b, "invalid request"...)
		if detail != "" {
			b = append(b, ": "...)
			b = append(b, detail...)
		}
		return append(b, "; fix the request before retrying"...)
	case sluice.ReasonPolicyRate:
		b = append(b, d.Gate...)
		if !d.Retryable {
			b = append(b, ": the request's cost"...)
			if !hide {
				b = append(b, " of "...)
				b = strconv.AppendInt(b, cost, 10)
				b = append(b, " exceeds the most this limit ever admits ("...)
				b = strconv.AppendInt(b, d.Limit, 10)
				b = append(b, ')')
			} else {
				b = append(b, " exceeds the most this limit ever admits"...)
			}
			return append(b, "; retrying cannot help"...)
		}
		b = append(b, ": rate limit exceeded"...)
		if !hide && d.Limit > 0 {
			b = appendQuota(b, d)
		}
	case sluice.ReasonConcurrency:
		b = append(b, d.Gate...)
		b = append(b, ": too many requests in flight"...)
		if !hide && d.Limit > 0 {
			b = append(b, " ("...)
			b = strconv.AppendInt(b, d.Limit, 10)
			b = append(b, " per "...)
			b = append(b, d.Scope.String()...)
			b = append(b, ')')
		}
	case sluice.ReasonOverload:
		b = append(b, "service overloaded, shedding load"...)
		if detail != "" { // the proxy's own resources: which ones
			b = append(b, " ("...)
			b = append(b, detail...)
			b = append(b, ')')
		}
	case sluice.ReasonQueue:
		b = append(b, d.Gate...)
		b = append(b, ": no slot within the time a request may wait"...)
	case sluice.ReasonDeadline:
		if d.EffectPossible {
			b = append(b, "the upstream did not answer in time (the request's deadline, or the proxy's upstream timeout, ran out)"...)
		} else {
			b = append(b, "the request cannot finish before its deadline"...)
		}
	case sluice.ReasonUpstream:
		b = append(b, "the upstream did not answer"...)
	case sluice.ReasonDependency:
		b = append(b, "admission state unavailable"...)
	}
	if retryAfter > 0 {
		b = append(b, "; retry after "...)
		b = strconv.AppendInt(b, retryAfter, 10)
		b = append(b, 's')
	} else if !d.Retryable {
		b = append(b, "; do not retry this request unchanged"...)
	}
	return b
}

// appendDuration appends d like time.Duration.String, without allocating
// for whole seconds and milliseconds.
// appendQuota appends " (…)" saying d's quota: a window's limit per
// window ("100 requests per 60s per tenant"), or a bucket's sustained rate
// and burst ("1 request per second per tenant, in bursts of up to 3").
func appendQuota(b []byte, d *sluice.Decision) []byte {
	b = append(b, " ("...)
	if !d.Refills || d.Window <= 0 {
		b = strconv.AppendInt(b, d.Limit, 10)
		b = append(b, " requests per "...)
		b = appendDuration(b, d.Window)
	} else {
		b = appendRate(b, float64(d.Limit)/d.Window.Seconds())
	}
	b = append(b, " per "...)
	b = append(b, d.Scope.String()...)
	if d.Refills && d.Window > 0 {
		b = append(b, ", in bursts of up to "...)
		b = strconv.AppendInt(b, d.Limit, 10)
	}
	return append(b, ')')
}

// rateUnits are the units a rate is said in, the first that gives at
// least one request.
var rateUnits = [...]struct {
	name    string
	seconds float64
}{{"second", 1}, {"minute", 60}, {"hour", 3600}, {"day", 86400}}

// appendRate appends perSecond as "N requests per <unit>", in the
// smallest unit where N ≥ 1 (whole when it is, else 3 significant
// digits).
func appendRate(b []byte, perSecond float64) []byte {
	u := rateUnits[len(rateUnits)-1]
	for _, c := range rateUnits {
		if perSecond*c.seconds >= 1-1e-9 {
			u = c
			break
		}
	}
	n := perSecond * u.seconds
	if r := math.Round(n); math.Abs(n-r) <= 1e-9*max(r, 1) {
		b = strconv.AppendInt(b, int64(r), 10)
		if r == 1 {
			b = append(b, " request per "...)
			return append(b, u.name...)
		}
	} else {
		b = strconv.AppendFloat(b, n, 'g', 3, 64)
	}
	b = append(b, " requests per "...)
	return append(b, u.name...)
}

func appendDuration(b []byte, d time.Duration) []byte {
	switch {
	case d > 0 && d%time.Second == 0:
		return append(strconv.AppendInt(b, int64(d/time.Second), 10), 's')
	case d > 0 && d%time.Millisecond == 0 && d < time.Second:
		return append(strconv.AppendInt(b, int64(d/time.Millisecond), 10), "ms"...)
	}
	return append(b, d.String()...)
}

// EnvelopeTemplate is a rejection envelope with everything but the retry
// delay and the request id rendered once, so that rejections of a steady
// state (the common case under overload) cost a few appends. Build one per
// distinct (gate, reason, scope, quota, retryable) and reuse it; it is
// immutable and safe for concurrent use.
type EnvelopeTemplate struct {
	head []byte // through "effect_possible":…
	msg  []byte // the JSON-escaped message, without a retry clause
}

// NewEnvelopeTemplate renders the static parts of the envelope for d.
func NewEnvelopeTemplate(d *sluice.Decision, cost int64, hide bool) *EnvelopeTemplate {
	t := &EnvelopeTemplate{}
	t.head = append(t.head, `{"error":{"reason":`...)
	t.head = appendJSONString(t.head, d.Reason.String())
	t.head = append(t.head, `,"scope":`...)
	t.head = appendJSONString(t.head, d.Scope.String())
	t.head = append(t.head, `,"gate":`...)
	t.head = appendJSONString(t.head, d.Gate)
	t.head = append(t.head, `,"retryable":`...)
	t.head = strconv.AppendBool(t.head, d.Retryable)
	t.head = append(t.head, `,"effect_possible":`...)
	t.head = strconv.AppendBool(t.head, d.EffectPossible)
	q := appendJSONString(nil, string(AppendMessage(nil, d, cost, 0, hide, "")))
	t.msg = q[1 : len(q)-1]
	return t
}

// Append appends the envelope with retry seconds (0: none) and requestID,
// which must need no JSON escaping (letters, digits, "-_.:"). It equals
// AppendEnvelope with the same fields.
func (t *EnvelopeTemplate) Append(b []byte, retry int64, requestID string) []byte {
	b = append(b, t.head...)
	if retry > 0 {
		b = append(b, `,"retry_after":`...)
		b = strconv.AppendInt(b, retry, 10)
	}
	b = append(b, `,"request_id":"`...)
	b = append(b, requestID...)
	b = append(b, `","message":"`...)
	b = append(b, t.msg...)
	if retry > 0 {
		b = append(b, "; retry after "...)
		b = strconv.AppendInt(b, retry, 10)
		b = append(b, 's')
	}
	return append(b, "\"}}\n"...)
}
