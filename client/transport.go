package client

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-go/sluice"
)

// Header names the Transport reads and writes.
const (
	defaultRequestIDHeader = "X-Request-Id"
	idempotencyKeyHeader   = "Idempotency-Key" // draft-ietf-httpapi-idempotency-key-header
)

// maxEnvelope bounds the bytes of a refusal's body read for its envelope.
const maxEnvelope = 4 << 10

// Transport is an http.RoundTripper that retries through a Retrier: it
// retries what may be retried (see RoundTrip), waits the jittered backoff
// or the server's Retry-After jittered upward, stops at the request's
// deadline, the attempt limit or the retry budget, refuses locally what the
// adaptive throttle sheds, and paces to the quota the server advertises.
// Every attempt carries the same request id (generated when the request has
// none) and the caller's Idempotency-Key, if any.
//
// A Transport is safe for concurrent use. Use one per service called: its
// Retrier's budget and throttle describe that service.
type Transport struct {
	// Base sends each attempt (default http.DefaultTransport).
	Base http.RoundTripper
	// Retrier decides; required.
	Retrier *Retrier
	// RequestIDHeader names the request id header (default X-Request-Id);
	// "-": none is added.
	RequestIDHeader string
	// Each attempt also carries the class and degradation level its
	// context says the caller's request was admitted as (sluice.ClassFrom,
	// sluice.LevelFrom: set by sluice's middleware, or by Propagated behind
	// sluice proxy) in sluice.ClassHeader and sluice.LevelHeader.
	//
	// DeadlineHeader, when set, carries each attempt's remaining budget
	// until the request's deadline, in milliseconds ("250ms"), as sluice's
	// identity rules read it (identity.deadline.header): the server then
	// knows what is left, not what the first attempt had.
	DeadlineHeader string
	// AttemptTimeout, when positive, bounds one attempt; an attempt cut
	// short by it is a failure a replay-safe request retries.
	AttemptTimeout time.Duration
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip sends req, retrying. An attempt is retried when it was refused
// for load or quota (429, 503) and the server does not say "do not retry"
// (a sluice envelope with retryable false); when a refusal may have had an
// effect (a 503 without a sluice envelope saying otherwise, 502, 504,
// a transport error, an attempt timeout) only a replay-safe request is
// retried: an idempotent method (RFC 9110 §9.2.2) or one with an
// Idempotency-Key, and a body that GetBody can send again. A request with a
// body and no GetBody is sent once. Any other answer is returned as is.
//
// It returns the last attempt's response (its body unread when the
// envelope was not needed, or replayed from what was read), or the last
// error; a local rejection returns an error wrapping ErrLocal, and a
// response already received is closed then.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := t.Retrier
	if r == nil {
		closeBody(req)
		return nil, errors.New("client: Transport without a Retrier")
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	safe := replayable && (idempotent(req.Method) || req.Header.Get(idempotencyKeyHeader) != "")
	ctx := req.Context()
	call := r.Begin(ctx, safe)
	id := t.requestID(req)
	var resp *http.Response
	var err error
	for {
		if aerr := call.Admit(); aerr != nil {
			if call.attemptsMade() == 0 {
				closeBody(req) // never sent: a RoundTripper closes the body, errors included
			}
			return nil, aerr
		}
		resp, err = t.attempt(ctx, base, req, call, id)
		res := classify(ctx, resp, err, call.attemptsMade() < r.o.MaxAttempts)
		if resp != nil {
			t.observe(resp)
		}
		if !replayable {
			res.Retryable = false // the body is gone
		}
		wait, stop := call.Next(res)
		if stop != "" {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, maxEnvelope))
			resp.Body.Close()
		}
		if werr := call.Wait(wait); werr != nil {
			return nil, werr
		}
	}
}

// closeBody closes req's body, which the base transport closes once it has
// sent req: for a request that returns before that (http.RoundTripper's
// contract; a file stays open, an io.Pipe's writer blocks for good).
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// attempt sends one attempt of req: a clone with the request id, the
// remaining deadline and a fresh body.
func (t *Transport) attempt(ctx context.Context, base http.RoundTripper, req *http.Request, call *Call, id string) (*http.Response, error) {
	actx := ctx
	var cancel context.CancelFunc
	if t.AttemptTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, t.AttemptTimeout)
	}
	out := req.Clone(actx)
	if id != "" {
		out.Header.Set(t.idHeader(), id)
	}
	// What the caller's own request was admitted as goes on with it: a
	// downstream sluice that trusts this service lowers its call to that
	// class, and serves it at that level.
	if c := sluice.ClassFrom(ctx); c != "" {
		out.Header.Set(sluice.ClassHeader, c)
	}
	if l := sluice.LevelFrom(ctx); l != sluice.LevelNormal {
		out.Header.Set(sluice.LevelHeader, l.String())
	}
	if t.DeadlineHeader != "" {
		if dl, ok := call.deadlineAt(); ok {
			left := max(dl.Sub(call.r.Now()), time.Millisecond)
			out.Header.Set(t.DeadlineHeader, strconv.FormatInt(left.Milliseconds(), 10)+"ms")
		}
	}
	if call.attemptsMade() > 1 && req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			if cancel != nil {
				cancel()
			}
			return nil, err
		}
		out.Body = body
	}
	resp, err := base.RoundTrip(out)
	if cancel != nil {
		if resp == nil {
			cancel()
		} else {
			resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		}
	}
	return resp, err
}

// cancelBody ends an attempt's timeout when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (t *Transport) idHeader() string {
	if t.RequestIDHeader == "" {
		return defaultRequestIDHeader
	}
	return t.RequestIDHeader
}

// requestID returns the id every attempt carries: the request's own, or a
// new one ("" with RequestIDHeader "-").
func (t *Transport) requestID(req *http.Request) string {
	if t.RequestIDHeader == "-" {
		return ""
	}
	if id := req.Header.Get(t.idHeader()); id != "" {
		return id
	}
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := t.Retrier.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return hex.EncodeToString(b[:])
}

// observe passes a response's RateLimit fields to the pacer.
func (t *Transport) observe(resp *http.Response) {
	v := resp.Header.Values("Ratelimit")
	if len(v) == 0 {
		return
	}
	limits, err := ParseRateLimit(joinFields(v))
	if err != nil {
		return // a malformed field paces nothing
	}
	var quotas []Quota
	if pv := resp.Header.Values("Ratelimit-Policy"); len(pv) > 0 {
		quotas, _ = ParsePolicy(joinFields(pv))
	}
	t.Retrier.Observe(limits, quotas)
}

func joinFields(v []string) string {
	if len(v) == 1 {
		return v[0]
	}
	var b bytes.Buffer
	for i, s := range v {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// idempotent reports whether method is idempotent (RFC 9110 §9.2.2).
func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// envelope is what a refusal's JSON body says about retrying: sluice's
// rejection envelope ({"error":{"retryable":…,"effect_possible":…}}), or
// the same fields as extension members of an RFC 9457 problem details
// object ({"type":…,"retryable":…,"effect_possible":…}).
type envelope struct {
	Retryable      bool
	EffectPossible bool
}

// retryFields are the two fields a client reads from either body.
type retryFields struct {
	Retryable      *bool `json:"retryable"`
	EffectPossible *bool `json:"effect_possible"`
}

// parseEnvelope reads the retry fields of a sluice refusal body: the
// envelope's, or with problem a problem details object's top-level
// members. ok is false when body is not one (not JSON, or without both
// fields).
func parseEnvelope(body []byte, problem bool) (e envelope, ok bool) {
	var f *retryFields
	if problem {
		f = new(retryFields)
		if json.Unmarshal(body, f) != nil {
			return envelope{}, false
		}
	} else {
		var v struct {
			Error *retryFields `json:"error"`
		}
		if json.Unmarshal(body, &v) != nil {
			return envelope{}, false
		}
		f = v.Error
	}
	if f == nil || f.Retryable == nil || f.EffectPossible == nil {
		return envelope{}, false
	}
	return envelope{Retryable: *f.Retryable, EffectPossible: *f.EffectPossible}, true
}

// classify reads an attempt's outcome.
func classify(ctx context.Context, resp *http.Response, err error, mayRetry bool) Result {
	if err != nil {
		if ctx.Err() != nil {
			return Result{Unanswered: true, Cause: "cancelled"} // the caller's own deadline or cancel: Next stops
		}
		cause := "error"
		if errors.Is(err, context.DeadlineExceeded) {
			cause = "timeout" // the attempt's own timeout
		}
		return Result{Unanswered: true, Retryable: true, EffectPossible: true, Cause: cause}
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
	default:
		return Result{OK: true}
	}
	res := Result{Retryable: true, Cause: "refused"}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		res.Refused = true
	} else {
		res.Cause = "upstream"
	}
	// Without an envelope: a 429 is a quota refusal before any work (RFC
	// 6585); a 503, 502 or 504 may come after work began.
	res.EffectPossible = resp.StatusCode != http.StatusTooManyRequests
	// The envelope only tells whether to retry: a last attempt leaves the
	// body unread (a slow one delayed the answer by as long as it took).
	if !mayRetry {
		return res
	}
	if env, ok := readEnvelope(resp); ok {
		res.Retryable, res.EffectPossible = env.Retryable, env.EffectPossible
	}
	if v := resp.Header.Get("Retry-After"); v != "" {
		date := time.Now()
		if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			date = d
		}
		if w, err := parseRetryAfter(v, date); err == nil {
			res.Wait = max(w, 1) // a zero wait still means "after this answer"
		}
	}
	return res
}

// readEnvelope reads the start of a JSON refusal body for its envelope and
// puts what it read back in front of the rest, so the caller reads the
// whole body.
func readEnvelope(resp *http.Response) (envelope, bool) {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" && mt != "application/problem+json" {
		return envelope{}, false
	}
	buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxEnvelope))
	resp.Body = &prefixBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), c: resp.Body}
	return parseEnvelope(buf, mt == "application/problem+json")
}

type prefixBody struct {
	io.Reader
	c io.Closer
}

func (b *prefixBody) Close() error { return b.c.Close() }
