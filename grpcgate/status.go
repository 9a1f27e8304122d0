package grpcgate

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-go/sluice"
)

// Metadata keys the interceptors write (gRPC metadata keys are lowercase).
const (
	// PushbackKey is gRFC A6's server pushback trailer: the milliseconds a
	// client's retry policy waits before the next attempt, or a negative
	// value for "do not retry".
	PushbackKey = "grpc-retry-pushback-ms"
	// RateLimitKey and RateLimitPolicyKey carry the RateLimit and
	// RateLimit-Policy fields of draft-ietf-httpapi-ratelimit-headers-10,
	// rendered as package wire renders them for HTTP.
	RateLimitKey       = "ratelimit"
	RateLimitPolicyKey = "ratelimit-policy"
	// LevelKey carries the degradation level of an admitted call when it
	// is not normal ("degrade", "shed" or "recover").
	LevelKey = "sluice-level"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail of every
// refusal; its reason is the decision's reason in upper case, e.g.
// "POLICY_RATE".
const ErrorDomain = "github.com/sluice-go/sluice"

// Code returns the gRPC status code for a decision: OK when admitted,
// INVALID_ARGUMENT for a malformed request, RESOURCE_EXHAUSTED for an
// entitlement rejection (the caller's own limit: Decision.Entitlement, the
// cases httpgate answers with 429), and UNAVAILABLE for every protection
// rejection (the service's capacity, a deadline it cannot meet, a failed
// dependency: httpgate's 503). Admitted work whose upstream failed (the
// proxy's reasons) answers UNAVAILABLE, or DEADLINE_EXCEEDED when it ran
// out of its deadline. The codes follow grpc/grpc doc/statuscodes.md:
// RESOURCE_EXHAUSTED is "a per-user quota" exhausted, UNAVAILABLE "most
// likely a transient condition".
func Code(d *sluice.Decision) codes.Code {
	switch {
	case d.Admitted:
		return codes.OK
	case d.Reason == sluice.ReasonInvalid:
		return codes.InvalidArgument
	case d.Reason == sluice.ReasonDeadline && d.EffectPossible:
		return codes.DeadlineExceeded
	case d.Entitlement():
		return codes.ResourceExhausted
	}
	return codes.Unavailable
}

// Outcome classifies how a handler ended, from its returned error and its
// context, as httpgate classifies a response: the caller went away
// (context cancelled, or CANCELED) → cancelled; DEADLINE_EXCEEDED → late;
// nil → useful (the Ticket makes it late past the request's deadline); a
// status the server is at fault for (UNKNOWN, INTERNAL, UNIMPLEMENTED,
// UNAVAILABLE, DATA_LOSS: the codes google.rpc.Code maps to 5xx, bar 504)
// → errored; any other status (the caller's fault, a 4xx) → useful. An
// error that is not a status is read as grpc-go's server reads it: a
// context error by its code, anything else as UNKNOWN.
func Outcome(ctx context.Context, err error) sluice.Outcome {
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return sluice.OutcomeCancelled
	}
	if err == nil {
		return sluice.OutcomeUseful
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	switch st.Code() {
	case codes.OK:
		return sluice.OutcomeUseful
	case codes.Canceled:
		return sluice.OutcomeCancelled
	case codes.DeadlineExceeded:
		return sluice.OutcomeLate
	case codes.Unknown, codes.Internal, codes.Unimplemented, codes.Unavailable, codes.DataLoss:
		return sluice.OutcomeErrored
	}
	return sluice.OutcomeUseful
}

// Pushback values besides a wait.
const (
	noPushback    = 0  // no trailer: the client's own backoff applies
	dontRetry     = -1 // "do not retry" (gRFC A6: any negative value)
	maxPushbackMS = math.MaxInt32
)

// Pushback returns the value of the grpc-retry-pushback-ms trailer for a
// refusal, as the interceptors send it (see the package documentation):
// the jittered wait in milliseconds (≥ 1), -1 for "do not retry", and set
// false when no pushback is to be sent. rnd is any uniformly random value.
func Pushback(d *sluice.Decision, j sluice.Jitter, rnd uint64) (ms int64, set bool) {
	ms, _ = pushback(d, j, rnd)
	return ms, ms != noPushback
}

// pushback returns the pushback for a refusal in milliseconds (noPushback
// or dontRetry, else ≥ 1) and the same wait in whole seconds, rounded up,
// for the message. The wait is the decision's exact RetryAfter rounded up
// to a millisecond and spread like httpgate's Retry-After: uniformly over
// [w, w + max(⌈w·Fraction⌉, Min s)], at millisecond resolution rather than
// seconds, since a gRPC client retries after exactly the pushback and adds
// no jitter of its own (gRFC A6). rnd is any uniformly random value.
func pushback(d *sluice.Decision, j sluice.Jitter, rnd uint64) (ms, secs int64) {
	switch {
	case d.Reason == sluice.ReasonInvalid:
		return noPushback, 0
	case !d.Retryable:
		return dontRetry, 0
	case d.RetryAfter <= 0:
		return noPushback, 0
	}
	base := int64(min(d.RetryAfter, maxPushbackMS*time.Millisecond) / time.Millisecond)
	if d.RetryAfter%time.Millisecond != 0 {
		base++
	}
	spread := int64(0)
	if j.Fraction > 0 || j.Min > 0 {
		frac := math.Ceil(float64(base) * j.Fraction)
		if !(frac > 0) { // NaN too
			frac = 0
		}
		spread = max(int64(math.Min(frac, maxPushbackMS)), min(j.Min, maxPushbackMS/1000)*1000, 0)
	}
	if spread > 0 {
		base += int64(rnd % uint64(spread+1))
	}
	ms = min(base, maxPushbackMS)
	return ms, (ms + 999) / 1000
}

// errorInfos caches the packed ErrorInfo detail of a refusal shape; the
// shapes are bounded by the chain's gates, reasons and scopes.
type errorInfos struct{ m sync.Map } // infoKey → *anypb.Any

type infoKey struct {
	gate      string
	reason    sluice.Reason
	scope     sluice.Scope
	retryable bool
}

func (c *errorInfos) get(d *sluice.Decision) *anypb.Any {
	k := infoKey{gate: d.Gate, reason: d.Reason, scope: d.Scope, retryable: d.Retryable}
	if v, ok := c.m.Load(k); ok {
		return v.(*anypb.Any)
	}
	ei := &errdetails.ErrorInfo{
		Reason: strings.ToUpper(d.Reason.String()),
		Domain: ErrorDomain,
		Metadata: map[string]string{
			"scope":           d.Scope.String(),
			"retryable":       strconv.FormatBool(d.Retryable),
			"effect_possible": strconv.FormatBool(d.EffectPossible),
		},
	}
	if d.Gate != "" {
		ei.Metadata["gate"] = d.Gate
	}
	a, err := anypb.New(ei)
	if err != nil { // cannot happen for a well-formed message
		return nil
	}
	v, _ := c.m.LoadOrStore(k, a)
	return v.(*anypb.Any)
}

// statusError builds the refusal's status: code, message, the ErrorInfo
// detail and, with a wait, a RetryInfo of pushbackMS.
func (c *errorInfos) statusError(d *sluice.Decision, msg string, pushbackMS int64) error {
	s := &spb.Status{Code: int32(Code(d)), Message: msg}
	if a := c.get(d); a != nil {
		s.Details = append(s.Details, a)
	}
	if pushbackMS > 0 {
		if a, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(pushbackMS) * time.Millisecond)}); err == nil {
			s.Details = append(s.Details, a)
		}
	}
	return status.ErrorProto(s)
}
