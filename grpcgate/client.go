package grpcgate

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/client"
)

// ClientOptions configures the client interceptors. The zero value is
// valid.
type ClientOptions struct {
	// Idempotent reports whether a method (a full method name,
	// "/pkg.Service/Method") may be repeated after an attempt that may have
	// had an effect. Default: none is; a refusal the server says had no
	// effect (sluice's ErrorInfo effect_possible "false") is retried for
	// any method.
	Idempotent func(method string) bool
	// RequestIDKey is the metadata key of the request id every attempt
	// carries (default "x-request-id"; a call's own value is kept).
	RequestIDKey string
	// MaxReplay bounds the messages a stream keeps to send again when it
	// is retried before its first answer; a stream that sends more is not
	// retried. Default 64.
	MaxReplay int
}

func (o *ClientOptions) defaults() {
	if o.Idempotent == nil {
		o.Idempotent = func(string) bool { return false }
	}
	if o.RequestIDKey == "" {
		o.RequestIDKey = "x-request-id"
	}
	o.RequestIDKey = strings.ToLower(o.RequestIDKey)
	if o.MaxReplay <= 0 {
		o.MaxReplay = 64
	}
}

// localError is a local rejection as a gRPC status (UNAVAILABLE) that
// still matches client.ErrLocal with errors.Is.
type localError struct{ err error }

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }
func (e *localError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.err.Error())
}

func local(err error) error {
	if errors.Is(err, client.ErrLocal) {
		return &localError{err}
	}
	return err
}

// UnaryClientInterceptor returns a unary client interceptor that retries
// calls through r, as client.Transport does for HTTP: a refusal
// (RESOURCE_EXHAUSTED or UNAVAILABLE from sluice's server interceptors,
// with an ErrorInfo or a pushback) is retried after the backoff or the
// pushback (grpc-retry-pushback-ms, gRFC A6) jittered upward, not at all
// after a negative pushback or an ErrorInfo saying retryable "false"; an
// UNAVAILABLE without either (a transport failure) only for an idempotent
// method. The deadline, the attempt limit, the retry budget, the adaptive
// throttle and quota pacing (the ratelimit trailer) apply as in package
// client. A local rejection is an UNAVAILABLE status error that also
// matches client.ErrLocal with errors.Is.
//
// Disable grpc-go's own retries (grpc.WithDisableRetry) on a connection
// that uses it, or the two multiply.
func UnaryClientInterceptor(r *client.Retrier, opts ClientOptions) grpc.UnaryClientInterceptor {
	opts.defaults()
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, copts ...grpc.CallOption) error {
		call := r.Begin(ctx, opts.Idempotent(method))
		ctx = withAdmitted(withRequestID(ctx, r, opts.RequestIDKey))
		for {
			if err := call.Admit(); err != nil {
				return local(err)
			}
			var trailer metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(copts, grpc.Trailer(&trailer))...)
			observe(r, trailer)
			wait, stop := call.Next(classifyStatus(ctx, err, trailer))
			if stop != "" {
				return err
			}
			if werr := call.Wait(wait); werr != nil {
				return status.FromContextError(werr).Err()
			}
		}
	}
}

// withRequestID gives ctx's outgoing metadata a request id unless it has
// one, so that every attempt carries the same.
func withRequestID(ctx context.Context, r *client.Retrier, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(key)) > 0 {
		return ctx
	}
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return metadata.AppendToOutgoingContext(ctx, key, hex.EncodeToString(b[:]))
}

// classKey is the metadata key of the class a call's caller was admitted
// as (sluice.ClassHeader, lowercase as gRPC keys are).
const classKey = "sluice-class"

// withAdmitted gives ctx's outgoing metadata the class and level its
// context says the caller's own request was admitted as
// (sluice.ClassFrom, sluice.LevelFrom: the server interceptor sets them),
// replacing any: a downstream sluice that trusts this service lowers the
// call to that class.
func withAdmitted(ctx context.Context) context.Context {
	c, l := sluice.ClassFrom(ctx), sluice.LevelFrom(ctx)
	if c == "" && l == sluice.LevelNormal {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Delete(classKey)
	md.Delete(LevelKey)
	if c != "" {
		md.Set(classKey, c)
	}
	if l != sluice.LevelNormal {
		md.Set(LevelKey, l.String())
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// observe passes a call's ratelimit trailer to the pacer.
func observe(r *client.Retrier, md metadata.MD) {
	rl := md.Get(RateLimitKey)
	if len(rl) == 0 {
		return
	}
	limits, err := client.ParseRateLimit(strings.Join(rl, ", "))
	if err != nil {
		return
	}
	quotas, _ := client.ParsePolicy(strings.Join(md.Get(RateLimitPolicyKey), ", "))
	r.Observe(limits, quotas)
}

// classifyStatus reads how an attempt ended from its error and trailer.
func classifyStatus(ctx context.Context, err error, trailer metadata.MD) client.Result {
	if err == nil {
		return client.Result{OK: true}
	}
	if ctx.Err() != nil {
		return client.Result{Unanswered: true, Cause: "cancelled"}
	}
	st := status.Convert(err)
	code := st.Code()
	if code != codes.Unavailable && code != codes.ResourceExhausted {
		return client.Result{OK: true} // an answer no retry changes
	}
	res := client.Result{Retryable: true, EffectPossible: true, Cause: "refused"}
	sluiceInfo := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() != ErrorDomain {
				continue
			}
			sluiceInfo = true
			res.Retryable = d.GetMetadata()["retryable"] != "false"
			res.EffectPossible = d.GetMetadata()["effect_possible"] != "false"
		case *errdetails.RetryInfo:
			if res.Wait == 0 && d.GetRetryDelay() != nil {
				res.Wait = min(max(d.GetRetryDelay().AsDuration(), 0), client.MaxWait)
			}
		}
	}
	pushback, hasPushback := pushbackOf(trailer)
	switch {
	case hasPushback && pushback < 0:
		res.Retryable = false
	case hasPushback:
		res.Wait = pushback
	}
	switch {
	case sluiceInfo || hasPushback:
		res.Refused = true
	case code == codes.Unavailable: // a transport failure, or a server's own
		res.Unanswered, res.Cause = true, "error"
	default: // RESOURCE_EXHAUSTED from elsewhere (a message size limit...)
		res.Retryable = false
	}
	return res
}

// pushbackOf reads grpc-retry-pushback-ms (gRFC A6, "Pushback"): the wait,
// or −1 for "do not retry", which a negative value says, and so does one
// that is not a 32-bit integer or a key given more than once (as grpc-go's
// own retries read them: clientStream.shouldRetry in stream.go). ok is
// false without the key.
func pushbackOf(md metadata.MD) (d time.Duration, ok bool) {
	v := md.Get(PushbackKey)
	switch len(v) {
	case 0:
		return 0, false
	case 1:
	default:
		return -1, true
	}
	ms, err := strconv.ParseInt(v[0], 10, 32)
	if err != nil || ms < 0 {
		return -1, true
	}
	return time.Duration(ms) * time.Millisecond, true
}

// StreamClientInterceptor returns a stream client interceptor over r: a
// stream is admitted (adaptive throttle, quota pacing) before it opens,
// and retried, as UnaryClientInterceptor retries a call, when it fails
// before its first answer (no header and no message received): the
// messages sent so far are sent again on the new stream, up to
// ClientOptions.MaxReplay. Once an answer has come, errors are returned.
func StreamClientInterceptor(r *client.Retrier, opts ClientOptions) grpc.StreamClientInterceptor {
	opts.defaults()
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, copts ...grpc.CallOption) (grpc.ClientStream, error) {
		s := &retryStream{call: r.Begin(ctx, opts.Idempotent(method)), r: r, max: opts.MaxReplay}
		s.ctx = withAdmitted(withRequestID(ctx, r, opts.RequestIDKey))
		s.open = func() (grpc.ClientStream, error) { return streamer(s.ctx, desc, cc, method, copts...) }
		for {
			if err := s.call.Admit(); err != nil {
				return nil, local(err)
			}
			cs, err := s.open()
			if err == nil {
				s.cs = cs
				return s, nil
			}
			wait, stop := s.call.Next(classifyStatus(s.ctx, err, nil))
			if stop != "" {
				return nil, err
			}
			if werr := s.call.Wait(wait); werr != nil {
				return nil, status.FromContextError(werr).Err()
			}
		}
	}
}

// retryStream is a client stream that can be opened again, with its sent
// messages replayed, until its first answer. As a grpc.ClientStream, one
// goroutine may send (SendMsg, CloseSend) while another receives (RecvMsg,
// Header): no lock is held while a call of the stream blocks.
type retryStream struct {
	call *client.Call
	r    *client.Retrier
	ctx  context.Context
	open func() (grpc.ClientStream, error)
	max  int

	// sendMu is held while sending (SendMsg, CloseSend, a replay), so that
	// messages go out in order and a replay comes before what follows it.
	sendMu sync.Mutex
	// mu guards what follows; it is never held while sending or receiving.
	mu        sync.Mutex
	cs        grpc.ClientStream
	sent      []any
	closed    bool // CloseSend called
	committed bool // no more retries: an answer came, or too much to replay
	answered  bool // the first answer came, or the stream ended
}

func (s *retryStream) current() grpc.ClientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cs
}

// answer records the stream's first answer: no more retries, and the
// attempt counts as accepted (the throttle's count; a refusal comes before
// any answer).
func (s *retryStream) answer() {
	s.mu.Lock()
	first := !s.answered
	s.answered, s.committed, s.sent = true, true, nil
	s.mu.Unlock()
	if first {
		s.call.End(client.Result{OK: true})
	}
}

func (s *retryStream) Header() (metadata.MD, error) {
	md, err := s.current().Header()
	if err == nil && md != nil {
		s.answer()
	}
	return md, err
}

func (s *retryStream) Trailer() metadata.MD     { return s.current().Trailer() }
func (s *retryStream) Context() context.Context { return s.current().Context() }

func (s *retryStream) CloseSend() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	s.closed = true
	cs := s.cs
	s.mu.Unlock()
	return cs.CloseSend()
}

func (s *retryStream) SendMsg(m any) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	if !s.committed {
		if len(s.sent) < s.max {
			s.sent = append(s.sent, m)
		} else {
			s.committed, s.sent = true, nil
		}
	}
	cs, replayable := s.cs, !s.committed
	s.mu.Unlock()
	err := cs.SendMsg(m)
	if errors.Is(err, io.EOF) && replayable {
		// The attempt ended before this message went out (a refusal
		// comes at the stream's start). m is kept for the next attempt;
		// RecvMsg learns how this one ended and retries or reports it.
		return nil
	}
	return err
}

func (s *retryStream) RecvMsg(m any) error {
	for {
		cs := s.current()
		err := cs.RecvMsg(m)
		if err == nil || errors.Is(err, io.EOF) {
			s.answer()
			return err
		}
		s.mu.Lock()
		first, retry := !s.answered, !s.committed
		s.mu.Unlock()
		if !first {
			return err // after an answer, errors are the caller's
		}
		observe(s.r, cs.Trailer())
		res := classifyStatus(s.ctx, err, cs.Trailer())
		if !retry { // sent more than it could replay: counted, not retried
			s.call.End(res)
			s.end()
			return err
		}
		wait, stop := s.call.Next(res)
		if stop != "" {
			s.end()
			return err
		}
		if werr := s.call.Wait(wait); werr != nil {
			return status.FromContextError(werr).Err()
		}
		if rerr := s.reopen(); rerr != nil {
			return rerr
		}
	}
}

// end marks the stream over without an answer: nothing more is retried.
func (s *retryStream) end() {
	s.mu.Lock()
	s.answered, s.committed, s.sent = true, true, nil
	s.mu.Unlock()
}

// reopen opens the stream again and replays what was sent. The replay runs
// on its own goroutine, holding sendMu (later sends wait for it), so that
// RecvMsg can read the new stream's answers while it runs: a server that
// answers each message before it reads the next would otherwise stall on
// flow control against a replay nobody reads for.
func (s *retryStream) reopen() error {
	if err := s.call.Admit(); err != nil {
		return local(err)
	}
	cs, err := s.open()
	if err != nil {
		s.call.End(classifyStatus(s.ctx, err, nil))
		return err
	}
	s.sendMu.Lock()
	s.mu.Lock()
	s.cs = cs
	msgs, closed := s.sent, s.closed
	s.mu.Unlock()
	go func() {
		defer s.sendMu.Unlock()
		for _, m := range msgs {
			if err := cs.SendMsg(m); err != nil {
				return // the attempt ended (io.EOF) or broke: RecvMsg gets its status
			}
		}
		if closed {
			cs.CloseSend()
		}
	}()
	return nil
}
