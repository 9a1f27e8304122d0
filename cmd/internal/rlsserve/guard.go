package rlsserve

import (
	"context"
	"hash/maphash"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
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
	// MaxCallsPerPeer is the most calls one client host runs at once,
	// every connection of its together (its IP address; an IPv6 client
	// its /64, which one host may hold whole): a quarter of MaxCalls, so
	// that one client that stalls its calls, or floods the server, leaves
	// the rest of the bound to the others. (A client's 5,120 stalled
	// calls over 20 connections held all of it, and every other caller
	// was refused until they timed out.) A decision takes milliseconds:
	// 1,024 at once is hundreds of thousands of calls a second from one
	// host, a sidecar's loopback included.
	MaxCallsPerPeer = MaxCalls / 4
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
// goroutine of its own; each client host's share of the bound is counted
// the same way (MaxCallsPerPeer). A call the transport ends before its handler runs
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
	perPeer int64 // the most calls of one peer (MaxCallsPerPeer; 0: max)
	timeout time.Duration
	calls   atomic.Int64
	peers   peerCounts
	log     *slog.Logger // where a handler's panic is logged
	codec   *decodeCodec // the server's (newGRPCServer)
	refused [refusedKinds]atomic.Uint64
}

// The kinds of calls the guard answers itself, counted by kind (the
// sluice_grpc_refused_total metric, GRPCServer.Collectors).
const (
	refusedBound       = iota // past MaxCalls: RESOURCE_EXHAUSTED
	refusedHostShare          // past MaxCallsPerPeer: RESOURCE_EXHAUSTED
	refusedUndecodable        // a message that does not decode: INVALID_ARGUMENT
	refusedPanicked           // a handler that panicked: INTERNAL
	refusedKinds
)

// refusedNames are the reason labels of the kinds above, in their order.
var refusedNames = [refusedKinds]string{"bound", "host_share", "undecodable", "panicked"}

// peerBuckets is the number of peerCounts' counters: a host shares its
// bound with another only when their addresses hash alike, about one pair
// in 4,096 (the hash is seeded per process: a client cannot pick an
// address that shares a given host's counter).
const peerBuckets = 4096

// peerCounts counts calls in progress by client host, in counters hashed
// from its address: no map, no lock and no entry to expire.
type peerCounts struct {
	seed maphash.Seed
	n    [peerBuckets]atomic.Int64
}

// bucket returns the counter of ctx's peer: hashed from its IP address
// (an IPv6 one's /64); every peer that is not an IP address (a Unix
// socket's) counts on one.
func (p *peerCounts) bucket(ctx context.Context) *atomic.Int64 {
	var a [16]byte
	if pr, ok := peer.FromContext(ctx); ok {
		if ta, ok := pr.Addr.(*net.TCPAddr); ok {
			ip := ta.AddrPort().Addr().Unmap()
			a = ip.As16()
			if ip.Is6() {
				clear(a[8:]) // the /64: a host may hold all of it
			}
		}
	}
	return &p.n[maphash.Bytes(p.seed, a[:])%peerBuckets]
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
	if g.perPeer > 0 && g.peers.bucket(ctx).Load() >= g.perPeer {
		return nil, g.peerRefusal()
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

// enter counts a call of ctx's peer in, or refuses it at a bound. It
// returns the peer's counter, for exit.
func (g *callGuard) enter(ctx context.Context) (*atomic.Int64, error) {
	var pc *atomic.Int64
	if g.perPeer > 0 {
		pc = g.peers.bucket(ctx)
		if pc.Add(1) > g.perPeer {
			pc.Add(-1)
			return nil, g.peerRefusal()
		}
	}
	if g.calls.Add(1) > g.max {
		g.calls.Add(-1)
		if pc != nil {
			pc.Add(-1)
		}
		return nil, g.refusal()
	}
	return pc, nil
}

// refusal is the answer to a call past the bound.
func (g *callGuard) refusal() error {
	g.refused[refusedBound].Add(1)
	return status.Errorf(codes.ResourceExhausted, "sluice serve: %d calls in progress, the server's bound; retry", g.max)
}

// peerRefusal is the answer to a call past its peer's share of the bound.
func (g *callGuard) peerRefusal() error {
	g.refused[refusedHostShare].Add(1)
	return status.Errorf(codes.ResourceExhausted, "sluice serve: %d calls in progress from this client host, its share of the server's bound; retry", g.perPeer)
}

// exit counts a call of method out (pc: its peer's counter, from enter);
// deferred by the handler, it turns a panic of the handler into an
// INTERNAL answer in *err.
func (g *callGuard) exit(method string, pc *atomic.Int64, err *error) {
	g.calls.Add(-1)
	if pc != nil {
		pc.Add(-1)
	}
	if p := recover(); p != nil {
		g.refused[refusedPanicked].Add(1)
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
			pc, err := g.enter(ctx)
			if err != nil {
				return nil, err
			}
			defer g.exit(name, pc, &err)
			return h(srv, ctx, func(m any) error {
				err := dec(m)
				if bad := g.codec.undecoded(m); bad != nil {
					g.refused[refusedUndecodable].Add(1)
					return bad
				}
				return err
			}, in)
		}
	}
	w.Streams = slices.Clone(sd.Streams)
	for i := range w.Streams {
		h, name := w.Streams[i].Handler, "/"+sd.ServiceName+"/"+w.Streams[i].StreamName
		w.Streams[i].Handler = func(srv any, ss grpc.ServerStream) (err error) {
			pc, err := g.enter(ss.Context())
			if err != nil {
				return err
			}
			defer g.exit(name, pc, &err)
			return h(srv, decodedStream{ss, g})
		}
	}
	return &w
}

// decodedStream is a streaming call whose messages that do not decode
// are answered INVALID_ARGUMENT (decodeCodec).
type decodedStream struct {
	grpc.ServerStream
	guard *callGuard
}

func (s decodedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if bad := s.guard.codec.undecoded(m); bad != nil {
		s.guard.refused[refusedUndecodable].Add(1)
		return bad
	}
	return err
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
	return newGRPCServer(workers, &callGuard{max: MaxCalls, perPeer: MaxCallsPerPeer, timeout: CallTimeout, log: log})
}

func newGRPCServer(workers int, g *callGuard) *GRPCServer {
	if g.log == nil {
		g.log = slog.Default()
	}
	g.peers.seed = maphash.MakeSeed()
	g.codec = newDecodeCodec()
	return &GRPCServer{Server: grpc.NewServer(serverOptions(workers, g)...), guard: g}
}

// InProgress returns the number of calls in progress, as the bound counts
// them (a call whose handler has begun and not returned).
func (s *GRPCServer) InProgress() int64 { return s.guard.calls.Load() }

// Collectors returns the server's metric: sluice_grpc_refused_total, the
// calls it answered itself by reason (bound and host_share:
// RESOURCE_EXHAUSTED at MaxCalls and MaxCallsPerPeer; undecodable: a
// message that does not decode, INVALID_ARGUMENT; panicked: a handler's
// panic, INTERNAL). None of them reaches a service's own counters.
func (s *GRPCServer) Collectors() []prometheus.Collector {
	cs := make([]prometheus.Collector, refusedKinds)
	for i := range cs {
		n := &s.guard.refused[i]
		cs[i] = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_grpc_refused_total",
			Help:        "gRPC calls the server answered itself, by reason: bound and host_share (RESOURCE_EXHAUSTED), undecodable (INVALID_ARGUMENT), panicked (INTERNAL).",
			ConstLabels: prometheus.Labels{"reason": refusedNames[i]}}, func() float64 { return float64(n.Load()) })
	}
	return cs
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
		grpc.ForceServerCodecV2(g.codec),
		grpc.InTapHandle(g.tap),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}
