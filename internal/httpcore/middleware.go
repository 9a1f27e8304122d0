package httpcore

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
)

// Canonical header keys the middleware writes.
const (
	hRetryAfter      = "Retry-After"
	hRateLimit       = "Ratelimit"
	hRateLimitPolicy = "Ratelimit-Policy"
	hLegacyLimit     = "X-Ratelimit-Limit"
	hLegacyRemaining = "X-Ratelimit-Remaining"
	hLegacyReset     = "X-Ratelimit-Reset"
	hContentType     = "Content-Type"
	hCacheControl    = "Cache-Control"
	hLevel           = "Sluice-Level" // the degradation level, when not normal
)

var levelValues = [...][]string{{"normal"}, {"degrade"}, {"shed"}, {"recover"}}

var (
	jsonType    = []string{"application/json"}
	problemType = []string{wire.ProblemContentType}
	noStore     = []string{"no-store"}
)

// struct is httpgate's (documented there).
type Middleware struct {
	state    atomic.Pointer[state]
	idPrefix string
	ids      atomic.Uint64
	bufs     sync.Pool                   // *[]byte for envelopes
	blocks   sync.Pool                   // *headerBlock for Rejections whose Fields copy
	reqs     sync.Pool                   // *sluice.Request; gates see it by pointer, so it would escape
	samples  [sluice.ReasonCount]sampler // the access log's rejection samples, by reason
}

// headerBlock holds a rejection's dynamic header values in one allocation.
type headerBlock struct {
	vals [3]string
	buf  [120]byte
}

type state struct {
	chain  *sluice.Chain
	c      *compiled
	jitter sluice.Jitter
	policy []string // RateLimit-Policy value, shared by every response
	reads  []string // the request headers the rules read (Headers)
	// propagated are the request fields the admission sets to pass the
	// decision on (Snapshot.Propagated; nil: none).
	propagated []string
	gates      map[string]*gateWire // per gate name; read-only after Update
	tmpls      sync.Map             // tmplKey → *wire.EnvelopeTemplate, for the rest
}

// gateWire caches what a gate's responses repeat: its quoted name for the
// RateLimit field, and the envelope template of its last rejection.
type gateWire struct {
	rlPrefix []byte // "name";r=
	last     atomic.Pointer[keyedTemplate]
}

type keyedTemplate struct {
	key tmplKey
	t   *wire.EnvelopeTemplate
}

// tmplKey identifies the static part of a rejection envelope.
type tmplKey struct {
	gate      string
	reason    sluice.Reason
	scope     sluice.Scope
	retryable bool
	refills   bool
	limit     int64
	window    int64
}

func (st *state) template(d *sluice.Decision, cost int64) *wire.EnvelopeTemplate {
	if !d.Retryable && d.Reason == sluice.ReasonPolicyRate {
		// The message quotes the client-chosen cost: render it once, never
		// cache it (a client could fill a cache with distinct costs).
		return wire.NewEnvelopeTemplate(d, cost, st.c.cfg.HideCapacity)
	}
	k := tmplKey{gate: d.Gate, reason: d.Reason, scope: d.Scope, retryable: d.Retryable, refills: d.Refills, limit: d.Limit, window: int64(d.Window)}
	// A gate's rejections mostly repeat one shape: try its last template.
	gw := st.gates[d.Gate]
	if gw != nil {
		if kt := gw.last.Load(); kt != nil && kt.key == k {
			return kt.t
		}
	}
	var t *wire.EnvelopeTemplate
	if v, ok := st.tmpls.Load(k); ok {
		t = v.(*wire.EnvelopeTemplate)
	} else {
		v, _ := st.tmpls.LoadOrStore(k, wire.NewEnvelopeTemplate(d, cost, st.c.cfg.HideCapacity))
		t = v.(*wire.EnvelopeTemplate)
	}
	if gw != nil {
		gw.last.Store(&keyedTemplate{key: k, t: t})
	}
	return t
}

// appendRateLimit appends the RateLimit field member for d's gate.
func (st *state) appendRateLimit(b []byte, d *sluice.Decision, t int64) []byte {
	gw := st.gates[d.Gate]
	if gw == nil {
		return wire.AppendRateLimit(b, d.Gate, d.Remaining, t)
	}
	b = append(b, gw.rlPrefix...)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	if t > 0 {
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
	}
	return b
}

// smallInts holds "0" to "255" as header values, shared by every response.
var smallInts = func() [][]string {
	v := make([][]string, 256)
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

// New is httpgate's (documented there).
func New(chain *sluice.Chain, cfg Config) (*Middleware, error) {
	var seed [4]byte
	crand.Read(seed[:])
	m := &Middleware{idPrefix: hex.EncodeToString(seed[:]) + "-"}
	m.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	m.blocks.New = func() any { return new(headerBlock) }
	m.reqs.New = func() any { return new(sluice.Request) }
	if err := m.Update(chain, cfg); err != nil {
		return nil, err
	}
	return m, nil
}

// func is httpgate's (documented there).
func (m *Middleware) Update(chain *sluice.Chain, cfg Config) error {
	if chain == nil {
		return errors.New("httpgate: nil chain")
	}
	c, err := cfg.compile()
	if err != nil {
		return err
	}
	st := &state{chain: chain, c: c, jitter: *c.cfg.Jitter, gates: map[string]*gateWire{}, reads: c.id.Headers()}
	if c.cfg.Propagate {
		st.propagated = []string{sluice.ClassHeader, sluice.LevelHeader}
		if dh := c.cfg.DeadlineHeader; dh != "" {
			st.propagated = append(st.propagated, http.CanonicalHeaderKey(dh))
		}
	}
	for _, g := range chain.Gates() {
		prefix := wire.AppendRateLimit(nil, g.Name(), 0, 0)
		st.gates[g.Name()] = &gateWire{rlPrefix: prefix[:len(prefix)-1]} // drop the "0"
	}
	if ps := chain.Policies(); len(ps) > 0 && !cfg.NoRateLimitHeaders && !cfg.HideCapacity {
		st.policy = []string{string(wire.AppendPolicies(nil, ps))}
	}
	m.state.Store(st)
	return nil
}

// func is httpgate's (documented there).
func (m *Middleware) Chain() *sluice.Chain { return m.state.Load().chain }

// func is httpgate's (documented there).
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	st := m.state.Load()
	req := m.reqs.Get().(*sluice.Request)
	*req = sluice.Request{}
	defer m.reqs.Put(req)
	budget, detail := st.c.id.IdentifyRequest(r, req)
	if detail == "" && st.c.cfg.TenantKey != nil {
		detail = tenantKey(st.c.cfg.TenantKey, r, req)
	}
	if detail != "" {
		d := st.chain.Refuse(req, sluice.Decision{Reason: sluice.ReasonInvalid})
		rid := m.reject(w, r, st, &d, req, detail)
		if al := st.c.cfg.AccessLog; al != nil {
			m.logRejected(al, st.chain.Clock().Now(), r, r.Method, r.URL.Path, req, &d, wire.Status(&d), rid, 0)
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
	d, tk := st.chain.Decide(ctx, req)
	if !d.Admitted {
		al := st.c.cfg.AccessLog
		var now clock.Instant
		if al != nil {
			now = st.chain.Clock().Now() // the decision's end, before the answer is written
		}
		rid := m.reject(w, r, st, &d, req, "")
		if al != nil {
			m.logRejected(al, now, r, r.Method, r.URL.Path, req, &d, wire.Status(&d), rid, waited(from, now))
		}
		return
	}
	if !st.c.cfg.NoRateLimitHeaders && !st.c.cfg.HideCapacity {
		m.admittedHeaders(w.Header(), st, &d)
	}
	rw := &responseRecorder{ResponseWriter: w}
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked: release, let the panic go on. A client
		// that went away first is why (a reverse proxy aborts its answer
		// with http.ErrAbortHandler when the client hangs up mid-body): it
		// books as cancelled, as a handler that returned would.
		o := sluice.OutcomeErrored
		if errors.Is(context.Cause(r.Context()), context.Canceled) {
			o = sluice.OutcomeCancelled
		}
		tk.Done(o)
	}()
	if d.Level != sluice.LevelNormal {
		ctx = sluice.ContextWithLevel(ctx, d.Level)
		w.Header()[hLevel] = levelValues[d.Level]
	}
	r = r.WithContext(sluice.ContextWithClass(ctx, req.Class))
	if st.c.cfg.Propagate {
		st.propagate(r.Header, req.Class, d.Level, req.Deadline)
	}
	var start clock.Instant
	var wait time.Duration
	al := st.c.cfg.AccessLog
	if al != nil {
		start = st.chain.Clock().Now()
		wait = waited(from, start)
	}
	next.ServeHTTP(rw, r)
	finished = true
	tk.DoneCost(outcome(rw, r), st.c.id.ActualCost(req.Operation, oneValue(w.Header()).get))
	if al != nil {
		logAdmitted(al, st.chain.Clock().Now().Sub(start), r, r.Method, r.URL.Path, req, rw.status, wait)
	}
}

// func is httpgate's (documented there).
func (m *Middleware) UpstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // nobody reads a response
	}
	d := sluice.Decision{Reason: sluice.ReasonUpstream, Retryable: true, EffectPossible: !neverSent(r.Method, r.Header, err)}
	if errors.Is(err, context.DeadlineExceeded) {
		d.Reason = sluice.ReasonDeadline
	}
	var req sluice.Request
	m.reject(w, r, m.state.Load(), &d, &req, "")
}

// neverSent reports whether a request of method with header, whose
// upstream call failed with err, cannot have reached the upstream: no
// connection was made (the dial was refused, or the name did not resolve)
// for a request no transport sends twice. A replayable request (an
// idempotent method, or an Idempotency-Key: the proxies' transports send
// it again after a reused connection fails) may have reached the upstream
// on its first attempt, whatever the last one's error. The answer then
// says the work had no effect (effect_possible false): a client may retry
// even what is not idempotent.
func neverSent(method string, header http.Header, err error) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return false // "": not known, taken as replayable
	}
	if len(header["Idempotency-Key"]) > 0 || len(header["X-Idempotency-Key"]) > 0 {
		return false
	}
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) && op.Op == "dial" || errors.As(err, &dns)
}

// func is httpgate's (documented there).
func (m *Middleware) Invalid(w http.ResponseWriter, r *http.Request, detail string) {
	m.InvalidStatus(w, r, http.StatusBadRequest, detail)
}

// func is httpgate's (documented there).
func (m *Middleware) InvalidStatus(w http.ResponseWriter, r *http.Request, status int, detail string) {
	m.refuse(w, r, sluice.Decision{Reason: sluice.ReasonInvalid}, clientStatus(status), detail)
}

// func is httpgate's (documented there).
func (m *Middleware) Busy(w http.ResponseWriter, r *http.Request, detail string) {
	m.refuse(w, r, busyDecision, http.StatusServiceUnavailable, detail)
}

// refuse answers r with the refusal d (counted as the chain's rejections
// are), status and detail, and logs it: Invalid's and Busy's answer.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, d sluice.Decision, status int, detail string) {
	st := m.state.Load()
	var req sluice.Request
	d = st.chain.Refuse(&req, d)
	rj := m.render(headerFields(w.Header()), r.Header, st, &d, &req, detail, false, status)
	w.WriteHeader(rj.Status)
	w.Write(rj.Body)
	rj.Release()
	if al := st.c.cfg.AccessLog; al != nil {
		m.logRejected(al, st.chain.Clock().Now(), r, r.Method, r.URL.Path, &req, &d, rj.Status, rj.RequestID, 0)
	}
}

// clientStatus is status if it is a 4xx (a caller's error), else 400.
func clientStatus(status int) int {
	if status < 400 || status > 499 {
		return http.StatusBadRequest
	}
	return status
}

// outcome classifies a finished handler: the client went away →
// cancelled; a 5xx → errored; anything else useful (the Ticket turns it
// into late past the deadline).
func outcome(rw *responseRecorder, r *http.Request) sluice.Outcome {
	if errors.Is(context.Cause(r.Context()), context.Canceled) {
		return sluice.OutcomeCancelled
	}
	if rw.status >= 500 {
		return sluice.OutcomeErrored
	}
	return sluice.OutcomeUseful
}

// admittedHeaders is admittedFields into a net/http header map, written
// out: through the Fields interface it cost the admitted pass 6% more
// instructions.
func (m *Middleware) admittedHeaders(h http.Header, st *state, d *sluice.Decision) {
	if st.policy != nil {
		h[hRateLimitPolicy] = st.policy
	}
	if !wire.HasRateLimit(d) {
		return
	}
	var buf [96]byte
	b := st.appendRateLimit(buf[:0], d, wire.Seconds(d.ResetAfter))
	h[hRateLimit] = []string{string(b)}
	if st.c.cfg.LegacyHeaders {
		h[hLegacyLimit] = []string{strconv.FormatInt(d.Limit, 10)}
		h[hLegacyRemaining] = []string{strconv.FormatInt(d.Remaining, 10)}
		h[hLegacyReset] = []string{strconv.FormatInt(wire.Seconds(d.ResetAfter), 10)}
	}
}

func (m *Middleware) admittedFields(h Fields, st *state, d *sluice.Decision, buf *[96]byte) {
	if st.policy != nil {
		h.Set(hRateLimitPolicy, st.policy)
	}
	if !wire.HasRateLimit(d) {
		return
	}
	b := st.appendRateLimit(buf[:0], d, wire.Seconds(d.ResetAfter))
	if vs, ok := h.(ValueSetter); ok {
		vs.SetValue(hRateLimit, b) // copied: no string, no slice
	} else {
		h.Set(hRateLimit, []string{string(b)})
	}
	if st.c.cfg.LegacyHeaders {
		h.Set(hLegacyLimit, []string{strconv.FormatInt(d.Limit, 10)})
		h.Set(hLegacyRemaining, []string{strconv.FormatInt(d.Remaining, 10)})
		h.Set(hLegacyReset, []string{strconv.FormatInt(wire.Seconds(d.ResetAfter), 10)})
	}
}

// reject writes a rejection: status, headers and the JSON envelope, and
// returns the request id it answered with.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, st *state, d *sluice.Decision, req *sluice.Request, detail string) string {
	rj := m.render(headerFields(w.Header()), r.Header, st, d, req, detail, false, 0)
	w.WriteHeader(rj.Status)
	w.Write(rj.Body)
	rj.Release()
	return rj.RequestID
}

// Fields receives the header fields of an answer the middleware renders
// for a server other than net/http's (sluice proxy's own): Set is given a
// canonical key and values it must copy before the Rejection's Release
// (after which they change), and must not modify.
type Fields interface {
	Set(key string, vals []string)
}

// ValueSetter is Fields that can also take one value as bytes, which
// SetValue copies before it returns (sluice proxy's response header): an
// admitted answer's RateLimit field then costs no string and no slice.
type ValueSetter interface {
	SetValue(key string, v []byte)
}

// headerFields is a net/http header map as Fields.
type headerFields http.Header

func (h headerFields) Set(key string, vals []string) { h[key] = vals }

// Rejection is a rendered answer that is not the upstream's: its header
// fields are already set; Status and Body are to be written, the body
// only until Release.
type Rejection struct {
	Status    int
	Body      []byte
	RequestID string
	bp        *[]byte
	blk       *headerBlock // pooled: the Fields copied the values
	m         *Middleware
}

// Release returns the body's buffer and the block of the header values;
// neither the body, the RequestID nor the values given to Fields may be
// used after it.
func (rj *Rejection) Release() {
	if rj.bp != nil {
		*rj.bp = (*rj.bp)[:0]
		rj.m.bufs.Put(rj.bp)
		rj.bp = nil
	}
	if rj.blk != nil {
		rj.m.blocks.Put(rj.blk)
		rj.blk = nil
	}
}

// render sets a rejection's header fields in h and renders its status and
// JSON envelope (or problem details). reqHeader is the request's, for the
// request id to echo. It allocates one buffer for the dynamic header
// values and one slice to hold them; the body goes through a pooled
// buffer. With pooled, the values' block comes from a pool and goes back
// with Release: for Fields that copy what they are given (the exchange
// API's contract); net/http's header map keeps them until the response is
// written, after the handler. status, if not 0, replaces the decision's
// (wire.Status) in the status line and the problem details.
func (m *Middleware) render(h Fields, reqHeader http.Header, st *state, d *sluice.Decision, req *sluice.Request, detail string, pooled bool, status int) Rejection {
	cfg := &st.c.cfg
	retry := int64(0)
	if d.Retryable {
		retry = wire.RetryAfter(d.RetryAfter, st.jitter, rand.Uint64())
	}
	quota := !cfg.NoRateLimitHeaders && !cfg.HideCapacity && wire.HasRateLimit(d)

	// Dynamic header values share one allocation.
	var blk *headerBlock
	if pooled {
		blk = m.blocks.Get().(*headerBlock)
	} else {
		blk = new(headerBlock)
	}
	hb := blk.buf[:0]
	vals := blk.vals[:0]
	switch {
	case retry > 0 && retry < int64(len(smallInts)):
		h.Set(hRetryAfter, smallInts[retry])
	case retry > 0:
		n := len(hb)
		hb = strconv.AppendInt(hb, retry, 10)
		vals = append(vals, unsafe.String(&hb[n], len(hb)-n))
		h.Set(hRetryAfter, last(vals))
	}
	if quota {
		if st.policy != nil {
			h.Set(hRateLimitPolicy, st.policy)
		}
		n := len(hb)
		t := retry
		if t == 0 {
			t = wire.Seconds(d.ResetAfter)
		}
		hb = st.appendRateLimit(hb, d, t)
		vals = append(vals, unsafe.String(&hb[n], len(hb)-n))
		h.Set(hRateLimit, last(vals))
		if cfg.LegacyHeaders { // as on an admitted answer, with the reset RateLimit gives
			for _, f := range [...]struct {
				key string
				v   int64
			}{{hLegacyLimit, d.Limit}, {hLegacyRemaining, d.Remaining}, {hLegacyReset, t}} {
				n := len(hb)
				hb = strconv.AppendInt(hb, f.v, 10)
				vals = append(vals, unsafe.String(&hb[n], len(hb)-n))
				h.Set(f.key, last(vals))
			}
		}
	}
	n := len(hb)
	if id, ok := st.c.id.RequestID(reqHeader); ok {
		hb = append(hb, id...)
	} else {
		hb = append(hb, m.idPrefix...)
		hb = strconv.AppendUint(hb, m.ids.Add(1), 16)
	}
	rid := unsafe.String(&hb[n], len(hb)-n)
	vals = append(vals, rid)
	h.Set(st.c.id.RequestIDHeader(), last(vals))
	h.Set(hCacheControl, noStore)

	bp := m.bufs.Get().(*[]byte)
	buf := (*bp)[:0]
	start := 0
	if status == 0 {
		status = wire.Status(d)
	}
	if detail == "" && !cfg.ProblemDetails {
		// Steady-state rejections reuse a rendered template.
		h.Set(hContentType, jsonType)
		buf = st.template(d, req.Cost).Append(buf, retry, rid)
	} else {
		// The message is built first, then the body after it in the
		// same buffer; only the body is written.
		buf = wire.AppendMessage(buf, d, req.Cost, retry, cfg.HideCapacity, detail)
		start = len(buf)
		env := wire.Envelope{
			Reason: d.Reason, Scope: d.Scope, Gate: d.Gate, Retryable: d.Retryable,
			EffectPossible: d.EffectPossible, RetryAfter: retry, RequestID: rid,
			Message: unsafe.String(unsafe.SliceData(buf), start),
		}
		if cfg.ProblemDetails {
			h.Set(hContentType, problemType)
			buf = wire.AppendProblem(buf, &env, status)
		} else {
			h.Set(hContentType, jsonType)
			buf = wire.AppendEnvelope(buf, &env)
		}
	}
	*bp = buf
	rj := Rejection{Status: status, Body: buf[start:], RequestID: rid, bp: bp, m: m}
	if pooled {
		rj.blk = blk
	}
	return rj
}

// last returns the last element of vals as a one-element slice that cannot
// be appended into its neighbours.
func last(vals []string) []string {
	i := len(vals) - 1
	return vals[i : i+1 : i+1]
}

// oneValue is an answer's header read for one field's only value.
type oneValue http.Header

// get returns the value of field name, or "" when the answer lacks it or
// repeats it: a cost said twice is malformed, as identify.ActualCost
// documents (Get read the first and charged it).
func (h oneValue) get(name string) string {
	vs := http.Header(h).Values(name)
	if len(vs) != 1 {
		return ""
	}
	return vs[0]
}

// responseRecorder remembers the status the handler wrote. It passes on
// every optional interface of net/http's writer that a handler may use
// (Flusher, Hijacker, io.ReaderFrom, and the rest through Unwrap).
type responseRecorder struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the final status: an informational one (103 Early
// Hints, 100 Continue) is sent ahead of it and does not count, except 101
// Switching Protocols, after which there is no other.
func (rw *responseRecorder) WriteHeader(code int) {
	if rw.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		rw.status = code
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *responseRecorder) Write(p []byte) (int, error) {
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	return rw.ResponseWriter.Write(p)
}

// ReadFrom forwards to the underlying writer's io.ReaderFrom, so that a
// file served through the middleware still goes out by sendfile (net/http's
// writer); io.Copy into the recorder would copy it through a buffer.
func (rw *responseRecorder) ReadFrom(src io.Reader) (int64, error) {
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	if rf, ok := rw.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{rw.ResponseWriter}, src)
}

// writerOnly hides every method of a writer but Write (io.Copy's
// destination, so that it cannot come back to ReadFrom).
type writerOnly struct{ io.Writer }

// Flush forwards to the underlying writer when it can flush.
func (rw *responseRecorder) Flush() {
	if f, ok := rw.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack forwards to the underlying writer when it can hijack.
func (rw *responseRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := rw.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, http.ErrNotSupported
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (rw *responseRecorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// tenantKey sets req.Tenant from key, bounded, or returns the 400 detail.
func tenantKey(key identify.KeyFunc, r *http.Request, req *sluice.Request) string {
	t, err := key(r)
	if err != nil {
		return err.Error()
	}
	req.Tenant = identify.BoundKey(t)
	return ""
}
