package grpcgate

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
)

// Interceptor runs a sluice Chain in front of a gRPC server's handlers:
// Unary and Stream return its interceptors. Each call is identified with
// the Options' rules, decided before its handler runs, and either refused
// (see the package documentation for codes and metadata) or handled with
// its deadline on the context and its Ticket released when the handler
// returns, panics included.
//
// The chain and options can be replaced at run time with Update (hot
// reload) without disturbing calls in flight. An Interceptor is safe for
// concurrent use.
type Interceptor struct {
	state    atomic.Pointer[state]
	idPrefix string
	ids      atomic.Uint64
	reqs     sync.Pool // *sluice.Request: gates see it by pointer, so it would escape
	hdrs     sync.Pool // http.Header for the identify rules
}

type state struct {
	chain  *sluice.Chain
	c      *compiled
	policy []string // ratelimit-policy value, shared by every call
	infos  errorInfos
}

// New returns an interceptor deciding with chain under opts. It returns an
// error for a nil chain and for rules package identify refuses.
func New(chain *sluice.Chain, opts Options) (*Interceptor, error) {
	var seed [4]byte
	crand.Read(seed[:])
	ic := &Interceptor{idPrefix: hex.EncodeToString(seed[:]) + "-"}
	ic.reqs.New = func() any { return new(sluice.Request) }
	ic.hdrs.New = func() any { return make(http.Header, 4) }
	if err := ic.Update(chain, opts); err != nil {
		return nil, err
	}
	return ic, nil
}

// UnaryServerInterceptor returns the unary interceptor of New(chain, opts).
func UnaryServerInterceptor(chain *sluice.Chain, opts Options) (grpc.UnaryServerInterceptor, error) {
	ic, err := New(chain, opts)
	if err != nil {
		return nil, err
	}
	return ic.Unary(), nil
}

// StreamServerInterceptor returns the stream interceptor of New(chain, opts).
func StreamServerInterceptor(chain *sluice.Chain, opts Options) (grpc.StreamServerInterceptor, error) {
	ic, err := New(chain, opts)
	if err != nil {
		return nil, err
	}
	return ic.Stream(), nil
}

// Update replaces the chain and options atomically. Calls already past
// their decision finish under the old chain (their Tickets release there).
func (ic *Interceptor) Update(chain *sluice.Chain, opts Options) error {
	if chain == nil {
		return errors.New("grpcgate: nil chain")
	}
	c, err := opts.compile()
	if err != nil {
		return err
	}
	st := &state{chain: chain, c: c}
	if ps := chain.Policies(); len(ps) > 0 && !opts.NoRateLimitMetadata && !opts.HideCapacity {
		st.policy = []string{string(wire.AppendPolicies(nil, ps))}
	}
	ic.state.Store(st)
	return nil
}

// Chain returns the chain currently deciding.
func (ic *Interceptor) Chain() *sluice.Chain { return ic.state.Load().chain }

// Unary returns the unary server interceptor.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor { return ic.unary }

// Stream returns the stream server interceptor. A stream is decided when
// it starts and holds its permits until its handler returns.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor { return ic.stream }

// call is what both interceptors share about one call.
type call struct {
	ctx    context.Context
	cancel context.CancelFunc // of a capped deadline, or nil
	tk     sluice.Ticket
}

// setTrailer sets md in the trailer of the call: on ss for a stream, on
// ctx's transport stream for a unary call (ss nil).
func setTrailer(ctx context.Context, ss grpc.ServerStream, md metadata.MD) {
	if ss != nil {
		ss.SetTrailer(md)
		return
	}
	grpc.SetTrailer(ctx, md) // fails only without a transport stream: nothing to tell then
}

// admit identifies and decides a call. When it refuses, err is the status
// to return, the refusal's trailer already set; when it admits, the
// returned call holds the handler's context and the Ticket. ss is the
// stream of a streaming call, nil for a unary one.
func (ic *Interceptor) admit(ctx context.Context, method string, ss grpc.ServerStream) (call, error) {
	st := ic.state.Load()
	req := ic.reqs.Get().(*sluice.Request)
	*req = sluice.Request{}
	defer ic.reqs.Put(req)

	h := ic.hdrs.Get().(http.Header)
	for _, k := range st.c.keys {
		if vs := metadata.ValueFromIncomingContext(ctx, k.md); len(vs) > 0 {
			h[k.canon] = vs
		}
	}
	in := identify.Input{Method: http.MethodPost, Path: method, Header: h}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		in.RemoteAddr = p.Addr.String()
	}
	_, detail := st.c.id.IdentifyInput(&in, req)
	rid, ridOK := st.c.id.RequestID(h)
	clear(h)
	ic.hdrs.Put(h)
	if detail != "" {
		d := st.chain.Refuse(req, sluice.Decision{Reason: sluice.ReasonInvalid})
		return call{}, ic.refuse(ctx, ss, st, &d, req, detail, rid, ridOK)
	}

	cl := call{ctx: ctx}
	now := st.chain.Clock().Now()
	rules := &st.c.opts.Rules
	if dl, ok := ctx.Deadline(); ok {
		budget := max(time.Until(dl), 0)
		if budget > rules.MaxDeadline {
			budget = rules.MaxDeadline
			cl.ctx, cl.cancel = context.WithTimeout(ctx, budget)
		}
		req.Deadline = max(now.Add(budget), 1) // 0 would mean no deadline
	} else if budget := min(rules.DefaultDeadline, rules.MaxDeadline); budget > 0 {
		cl.ctx, cl.cancel = context.WithTimeout(ctx, budget)
		req.Deadline = now.Add(budget)
	}
	d, tk := st.chain.Decide(cl.ctx, req)
	if !d.Admitted {
		if cl.cancel != nil {
			cl.cancel()
		}
		return call{}, ic.refuse(ctx, ss, st, &d, req, "", rid, ridOK)
	}
	cl.tk = tk
	cl.ctx = sluice.ContextWithClass(cl.ctx, req.Class)
	if d.Level != sluice.LevelNormal {
		cl.ctx = sluice.ContextWithLevel(cl.ctx, d.Level)
	}
	if md := st.admittedTrailer(&d); md != nil {
		setTrailer(ctx, ss, md)
	}
	return cl, nil
}

// admittedTrailer returns the trailer of an admitted call: the RateLimit
// fields and a level that is not normal; nil when there is nothing to say.
func (st *state) admittedTrailer(d *sluice.Decision) metadata.MD {
	quota := !st.c.opts.NoRateLimitMetadata && !st.c.opts.HideCapacity
	level := d.Level != sluice.LevelNormal
	if !level && (!quota || (st.policy == nil && !wire.HasRateLimit(d))) {
		return nil
	}
	md := make(metadata.MD, 3)
	if quota {
		if st.policy != nil {
			md[RateLimitPolicyKey] = st.policy
		}
		if wire.HasRateLimit(d) {
			var buf [96]byte
			md[RateLimitKey] = []string{string(wire.AppendRateLimit(buf[:0], d.Gate, d.Remaining, wire.Seconds(d.ResetAfter)))}
		}
	}
	if level {
		md[LevelKey] = []string{d.Level.String()}
	}
	return md
}

// refuse sets a refusal's trailer and returns its status error.
func (ic *Interceptor) refuse(ctx context.Context, ss grpc.ServerStream, st *state, d *sluice.Decision, req *sluice.Request, detail, rid string, ridOK bool) error {
	cfg := &st.c.opts
	ms, secs := pushback(d, st.c.jitter, rand.Uint64())
	md := make(metadata.MD, 4)
	if ms != noPushback {
		md[PushbackKey] = []string{strconv.FormatInt(ms, 10)}
	}
	if !cfg.NoRateLimitMetadata && !cfg.HideCapacity && wire.HasRateLimit(d) {
		if st.policy != nil {
			md[RateLimitPolicyKey] = st.policy
		}
		t := secs
		if t == 0 {
			t = wire.Seconds(d.ResetAfter)
		}
		md[RateLimitKey] = []string{string(wire.AppendRateLimit(nil, d.Gate, d.Remaining, t))}
	}
	if !ridOK {
		rid = ic.idPrefix + strconv.FormatUint(ic.ids.Add(1), 16)
	}
	md[st.c.ridKey] = []string{rid}
	setTrailer(ctx, ss, md)
	msg := wire.AppendMessage(make([]byte, 0, 128), d, req.Cost, secs, cfg.HideCapacity, detail)
	if cfg.NoStatusDetails {
		return status.Error(Code(d), string(msg))
	}
	return st.infos.statusError(d, string(msg), ms)
}

func (ic *Interceptor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	cl, err := ic.admit(ctx, info.FullMethod, nil)
	if err != nil {
		return nil, err
	}
	if cl.cancel != nil {
		defer cl.cancel()
	}
	finished := false
	defer func() {
		if !finished { // the handler panicked or called runtime.Goexit: release, let it go on
			cl.tk.Done(sluice.OutcomeErrored)
		}
	}()
	resp, err := handler(cl.ctx, req)
	finished = true
	cl.tk.Done(Outcome(cl.ctx, err))
	return resp, err
}

func (ic *Interceptor) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	cl, err := ic.admit(ctx, info.FullMethod, ss)
	if err != nil {
		return err
	}
	if cl.cancel != nil {
		defer cl.cancel()
	}
	if cl.ctx != ctx {
		ss = &serverStream{ServerStream: ss, ctx: cl.ctx}
	}
	finished := false
	defer func() {
		if !finished {
			cl.tk.Done(sluice.OutcomeErrored)
		}
	}()
	err = handler(srv, ss)
	finished = true
	cl.tk.Done(Outcome(cl.ctx, err))
	return err
}

// serverStream is a stream whose handler sees a derived context (a capped
// deadline, the degradation level).
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
