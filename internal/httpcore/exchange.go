package httpcore

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
)

// The exchange API decides requests that a server other than net/http's
// reads (sluice proxy serves HTTP/1.1 with its own server for speed): the
// same rules, chain, answers, access log and hot reload as Wrap, with the
// request given as an identify.Input and the answer's header fields
// written through Fields. Wrap is this API behind http.Handler.

// Snapshot is the middleware's rules and chain at one moment: a request
// read with its Headers is decided with its Admit, under the same policy
// even when Update replaces it in between.
type Snapshot struct {
	m  *Middleware
	st *state
}

// Snapshot returns the rules and chain deciding now.
func (m *Middleware) Snapshot() Snapshot { return Snapshot{m: m, st: m.state.Load()} }

// Headers returns the canonical names of every request header the rules
// read to decide (identify.Identifier.Headers). A server that copies only
// these into the Input decides as Wrap would. The slice is shared: it must
// not be modified.
func (sn Snapshot) Headers() []string { return sn.st.reads }

// ReadsAddr reports whether deciding reads the Input's RemoteAddr (a
// tenant keyed by client IP, a TenantKey, the access log): a server may
// leave it empty otherwise.
func (sn Snapshot) ReadsAddr() bool {
	c := sn.st.c
	return c.id.ReadsClientIP() || c.cfg.TenantKey != nil || c.cfg.AccessLog != nil
}

// TrustedProxy reports whether the peer at remoteAddr is a trusted proxy
// of the rules (identify.Identifier.TrustedProxy): a proxy appends to its
// forwarding header rather than replacing it.
func (sn Snapshot) TrustedProxy(remoteAddr string) bool { return sn.st.c.id.TrustedProxy(remoteAddr) }

// Propagated returns the canonical names of the request fields an
// admission sets to pass the decision on (Admission.Propagate, and Wrap
// on the request): the class, the level and the deadline field; none when
// the rules do not propagate. A server that drops fields after the
// admission (those a Connection field names) must keep these: they are
// sluice's, not the client's. The slice is shared: it must not be
// modified.
func (sn Snapshot) Propagated() []string { return sn.st.propagated }

// MayWait reports whether Admit may wait (a wait queue in the chain,
// sluice.Chain.MayWait): only then does a server gain from cancelling
// Admit's context when the client goes away.
func (sn Snapshot) MayWait() bool { return sn.st.chain.MayWait() }

// Admission is an admitted request of Admit: its handler runs, then Done
// reports how it ended. It is not safe for concurrent use.
type Admission struct {
	m      *Middleware
	st     *state
	tk     sluice.Ticket
	dec    sluice.Decision
	req    sluice.Request
	budget time.Duration
	start  clock.Instant
	wait   time.Duration // how long the decision waited (logged; 0: not, or too short to tell)
	actual int64         // the work's actual cost from the answer (ReadCost); 0: the estimate
	remote string
	method string
	path   string
	done   bool
	field  [96]byte // where SetHeaders writes the RateLimit field's value
}

// Admit identifies and decides the request in under the snapshot's
// policy, waiting (in a wait queue)
// at most until ctx is done or the request's deadline passes. Admitted,
// it returns the Admission and ok true; otherwise the rejection (400,
// 429 or 503) is rendered: its header fields are set in f, and the
// caller writes rj.Status and rj.Body, then calls rj.Release. in.Header
// needs only the fields Headers names.
func (sn Snapshot) Admit(ctx context.Context, in *identify.Input, f Fields) (adm Admission, rj Rejection, ok bool) {
	m, st := sn.m, sn.st
	req := m.reqs.Get().(*sluice.Request)
	*req = sluice.Request{}
	defer m.reqs.Put(req)
	budget, detail := st.c.id.IdentifyInput(in, req)
	if detail == "" && st.c.cfg.TenantKey != nil {
		r := &http.Request{Method: in.Method, URL: &url.URL{Path: in.Path, RawQuery: in.RawQuery}, Header: in.Header, RemoteAddr: in.RemoteAddr}
		detail = tenantKey(st.c.cfg.TenantKey, r.WithContext(ctx), req)
	}
	if detail != "" {
		d := st.chain.Refuse(req, sluice.Decision{Reason: sluice.ReasonInvalid})
		return adm, m.renderLogged(ctx, f, in, st, &d, req, detail), false
	}
	if budget > 0 {
		req.Deadline = st.chain.Clock().Now().Add(budget)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	from := st.waitFrom()
	d, tk := st.chain.Decide(ctx, req)
	if !d.Admitted {
		return adm, m.renderLoggedWait(ctx, f, in, st, &d, req, "", 0, from), false
	}
	adm = Admission{m: m, st: st, tk: tk, dec: d, req: *req, budget: budget, remote: in.RemoteAddr, method: in.Method, path: in.Path}
	if st.c.cfg.AccessLog != nil {
		adm.start = st.chain.Clock().Now()
		adm.wait = waited(from, adm.start)
	}
	return adm, rj, true
}

// renderLogged renders a rejection of in and logs it.
func (m *Middleware) renderLogged(ctx context.Context, f Fields, in *identify.Input, st *state, d *sluice.Decision, req *sluice.Request, detail string) Rejection {
	return m.renderLoggedStatus(ctx, f, in, st, d, req, detail, 0)
}

// renderLoggedStatus is renderLogged with status (0: the decision's) as
// render takes it.
func (m *Middleware) renderLoggedStatus(ctx context.Context, f Fields, in *identify.Input, st *state, d *sluice.Decision, req *sluice.Request, detail string, status int) Rejection {
	return m.renderLoggedWait(ctx, f, in, st, d, req, detail, status, 0)
}

// renderLoggedWait is renderLoggedStatus of a decision that began at from
// (waitFrom; 0: its wait is not logged).
func (m *Middleware) renderLoggedWait(ctx context.Context, f Fields, in *identify.Input, st *state, d *sluice.Decision, req *sluice.Request, detail string, status int, from clock.Instant) Rejection {
	al := st.c.cfg.AccessLog
	var now clock.Instant
	if al != nil {
		now = st.chain.Clock().Now() // the decision's end, before the answer is rendered
	}
	rj := m.render(f, in.Header, st, d, req, detail, true, status)
	if al != nil {
		m.logRejectedAt(al, now, ctx, in.RemoteAddr, in.Method, in.Path, req, d, rj.Status, rj.RequestID, waited(from, now))
	}
	return rj
}

// SetPath replaces the path the access log shows for the request (a
// server whose Input viewed a buffer it reuses gives a copy).
func (a *Admission) SetPath(path string) { a.path = path }

// Budget is the request's time budget from its deadline header or the
// rules' default (0: none), counted from its decision.
func (a *Admission) Budget() time.Duration { return a.budget }

// Level is the degradation level the request was admitted at.
func (a *Admission) Level() sluice.Level { return a.dec.Level }

// SetHeaders sets the admitted answer's own header fields in f, as Wrap
// sets them before its handler writes: RateLimit-Policy and RateLimit
// (unless the config turns them off) and Sluice-Level above normal.
func (a *Admission) SetHeaders(f Fields) {
	st := a.st
	if !st.c.cfg.NoRateLimitHeaders && !st.c.cfg.HideCapacity {
		a.m.admittedFields(f, st, &a.dec, &a.field)
	}
	if a.dec.Level != sluice.LevelNormal {
		f.Set(hLevel, levelValues[a.dec.Level])
	}
}

// ReadCost reads the work's actual cost from the answer's header, when the
// request's route names one (identify.Cost.ResponseHeader), for Done to
// charge: header returns a field of the answer ("" when absent).
func (a *Admission) ReadCost(header func(name string) string) {
	a.actual = a.st.c.id.ActualCost(a.req.Operation, header)
}

// Done reports how the admitted request ended, once (later calls do
// nothing): status is the one answered to the client (a 5xx counts as an
// error), cancelled that the client went away first; a request done past
// its deadline counts as late. It logs the request's access line.
func (a *Admission) Done(ctx context.Context, status int, cancelled bool) {
	if a.done {
		return
	}
	a.done = true
	o := sluice.OutcomeUseful
	switch {
	case cancelled:
		o = sluice.OutcomeCancelled
	case status >= 500:
		o = sluice.OutcomeErrored
	}
	a.tk.DoneCost(o, a.actual)
	if al := a.st.c.cfg.AccessLog; al != nil {
		logAdmittedAt(al, a.st.chain.Clock().Now().Sub(a.start), ctx, a.remote, a.method, a.path, &a.req, status, a.wait)
	}
}

// RenderUpstreamError renders the answer to an admitted request whose
// upstream call failed with err, as UpstreamError writes it (504 with
// reason deadline when err is context.DeadlineExceeded, 502 with reason
// upstream otherwise). method and reqHeader are the request's (whether it
// may have reached the upstream, "" for a request that may have been sent
// twice; the request id).
func (m *Middleware) RenderUpstreamError(f Fields, method string, reqHeader http.Header, err error) Rejection {
	d := sluice.Decision{Reason: sluice.ReasonUpstream, Retryable: true, EffectPossible: !neverSent(method, reqHeader, err)}
	if errors.Is(err, context.DeadlineExceeded) {
		d.Reason = sluice.ReasonDeadline
	}
	var req sluice.Request
	return m.render(f, reqHeader, m.state.Load(), &d, &req, "", true, 0)
}

// RenderInvalid renders and logs the 400 answer to a request the caller
// got wrong before it reached the gates, as Invalid writes it.
func (m *Middleware) RenderInvalid(ctx context.Context, f Fields, in *identify.Input, detail string) Rejection {
	return m.RenderInvalidStatus(ctx, f, in, http.StatusBadRequest, detail)
}

// RenderBusy renders and logs the answer Busy writes.
func (m *Middleware) RenderBusy(ctx context.Context, f Fields, in *identify.Input, detail string) Rejection {
	return m.renderRefusal(ctx, f, in, busyDecision, http.StatusServiceUnavailable, detail)
}

// busyDecision is the refusal of a request the server has no room for
// (Busy): the service's fault, worth retrying a second later.
var busyDecision = sluice.Decision{Reason: sluice.ReasonOverload, Retryable: true, RetryAfter: time.Second}

// RenderInvalidStatus renders and logs the answer InvalidStatus writes:
// RenderInvalid's, with status (413, 431; a status outside 400-499 is
// 400) in the status line and a problem details body.
func (m *Middleware) RenderInvalidStatus(ctx context.Context, f Fields, in *identify.Input, status int, detail string) Rejection {
	return m.renderRefusal(ctx, f, in, sluice.Decision{Reason: sluice.ReasonInvalid}, clientStatus(status), detail)
}

// renderRefusal renders and logs the refusal d (counted as the chain's
// rejections are) with status and detail: RenderInvalidStatus's and
// RenderBusy's answer.
func (m *Middleware) renderRefusal(ctx context.Context, f Fields, in *identify.Input, d sluice.Decision, status int, detail string) Rejection {
	st := m.state.Load()
	var req sluice.Request
	d = st.chain.Refuse(&req, d)
	return m.renderLoggedStatus(ctx, f, in, st, &d, &req, detail, status)
}
