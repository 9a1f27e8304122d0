package rlsserve

import (
	"context"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// The bounds of sluice serve's gRPC servers (the rate limit service and
// ext_authz): what a caller can hold of them, and what happens at the
// bound.
const (
	// MaxStreamsPerConn is the most calls one connection runs at once
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); its client queues the rest.
	MaxStreamsPerConn = 256
	// MaxCalls is the most calls the server runs at once, every
	// connection together: one past it is refused at once with
	// RESOURCE_EXHAUSTED, while the server is at the bound before a
	// goroutine or a buffer is spent on it (callGuard).
	MaxCalls = 4096
	// CallTimeout bounds a call that came without a shorter deadline: a
	// rate limit check or an authorization check takes milliseconds, and a
	// call whose message never comes (a stalled client) gives its slot
	// back after this long (DEADLINE_EXCEEDED).
	CallTimeout = 10 * time.Second
)

// callGuard counts a server's calls in progress: each method's handler
// (GRPCServer.RegisterService) counts its call in on entry, before it
// reads the call's message (grpc-go runs a unary handler first and the
// message is read in it; TestStalledCallsAreBounded would see a version
// that did otherwise), and out on return, with no allocation and no
// goroutine of its own. A call the transport ends before its handler runs
// (an unknown method, a deadline already past) holds nothing of the bound.
// While the count is at the bound the tap refuses new calls before the
// transport spends a stream, a goroutine or a buffer on them: a flood of
// calls past the bound costs what it cost when the tap counted (50,000
// stalled calls, TestServeBoundsStalledCalls: 147-166 MB resident against
// 145-160 then; refused in the handlers alone, 161-236 MB).
//
// A handler that panics is answered INTERNAL and logged with its stack
// (grpc-go recovers no handler's panic: one would end the process, and
// every caller's service with it); its slot is given back as on return.
type callGuard struct {
	max     int64
	timeout time.Duration
	calls   atomic.Int64
	log     *slog.Logger // where a handler's panic is logged
}

// tap refuses a new call while the count is at the bound (it counts
// nothing: the handlers do), and bounds its wait for its message: a call
// without a deadline of its own within timeout gets one (a handler blocked
// on a message that never comes returns then, and its slot with it). A
// call that has one, as Envoy's always do, costs nothing more here.
func (g *callGuard) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	if g.calls.Load() >= g.max {
		return nil, g.refusal()
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= g.timeout {
		return ctx, nil
	}
	// The stream's own context is cancelled when the call ends, which
	// cancels this one and stops its timer.
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	_ = cancel
	return ctx, nil
}

// enter counts a call in, or refuses it at the bound.
func (g *callGuard) enter() error {
	if g.calls.Add(1) > g.max {
		g.calls.Add(-1)
		return g.refusal()
	}
	return nil
}

// refusal is the answer to a call past the bound.
func (g *callGuard) refusal() error {
	return status.Errorf(codes.ResourceExhausted, "sluice serve: %d calls in progress, the server's bound; retry", g.max)
}

// exit counts a call of method out; deferred by the handler, it turns a
// panic of the handler into an INTERNAL answer in *err.
func (g *callGuard) exit(method string, err *error) {
	g.calls.Add(-1)
	if p := recover(); p != nil {
		g.log.Error("sluice serve: a gRPC handler panicked; the call is answered INTERNAL", "method", method, "panic", p, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "sluice serve: internal error")
	}
}

// wrap returns sd with every handler counted by g.
func (g *callGuard) wrap(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	w := *sd
	w.Methods = slices.Clone(sd.Methods)
	for i := range w.Methods {
		h, name := w.Methods[i].Handler, "/"+sd.ServiceName+"/"+w.Methods[i].MethodName
		w.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (resp any, err error) {
			if err := g.enter(); err != nil {
				return nil, err
			}
			defer g.exit(name, &err)
			return h(srv, ctx, dec, in)
		}
	}
	w.Streams = slices.Clone(sd.Streams)
	for i := range w.Streams {
		h, name := w.Streams[i].Handler, "/"+sd.ServiceName+"/"+w.Streams[i].StreamName
		w.Streams[i].Handler = func(srv any, ss grpc.ServerStream) (err error) {
			if err := g.enter(); err != nil {
				return err
			}
			defer g.exit(name, &err)
			return h(srv, ss)
		}
	}
	return &w
}

// GRPCServer is a gRPC server with sluice serve's options (NewGRPCServer)
// and bounds: a service registered on it (it is a grpc.ServiceRegistrar)
// has each call counted against MaxCalls. Register through it, never
// through the embedded grpc.Server.
type GRPCServer struct {
	*grpc.Server
	guard *callGuard
}

// NewGRPCServer returns a gRPC server with sluice serve's options and
// bounds, and a pool of workers stream workers (see serverOptions); a
// handler's panic is logged to log (nil: slog.Default()) and answered
// INTERNAL.
func NewGRPCServer(workers int, log *slog.Logger) *GRPCServer {
	return newGRPCServer(workers, &callGuard{max: MaxCalls, timeout: CallTimeout, log: log})
}

func newGRPCServer(workers int, g *callGuard) *GRPCServer {
	if g.log == nil {
		g.log = slog.Default()
	}
	return &GRPCServer{Server: grpc.NewServer(serverOptions(workers, g)...), guard: g}
}

// RegisterService registers impl for sd, each call of its methods counted
// against the bounds.
func (s *GRPCServer) RegisterService(sd *grpc.ServiceDesc, impl any) {
	s.Server.RegisterService(s.guard.wrap(sd), impl)
}

// guardOptions are the gRPC server options of the bounds: the stream
// limits, and keepalive enforcement (a client may ping at most every 10 s,
// also without a call in progress; one that pings more often is
// disconnected, as gRPC's default policy would do at 5 minutes).
func guardOptions(g *callGuard) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		grpc.InTapHandle(g.tap),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}
