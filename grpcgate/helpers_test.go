package grpcgate_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manual clock: time moves only with Advance.
type fakeClock struct{ now atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.now.Store(int64(time.Second)) // not the epoch: 0 means "no deadline"
	return c
}

func (c *fakeClock) Now() clock.Instant      { return clock.Instant(c.now.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// probe is the last gate of the fixture's chain: it admits (or rejects
// with a set decision), records what it saw and counts what it holds.
type probe struct {
	mu       sync.Mutex
	last     sluice.Request
	decides  int
	level    sluice.Level
	reject   *sluice.Decision
	inflight atomic.Int64
	released chan sluice.Outcome
}

func newProbe() *probe { return &probe{released: make(chan sluice.Outcome, 256)} }

func (p *probe) Name() string { return "probe" }

func (p *probe) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var permit sluice.Permit
	*d, permit = p.decide(ctx, r, now)
	return permit
}

func (p *probe) decide(_ context.Context, r *sluice.Request, _ clock.Instant) (sluice.Decision, sluice.Permit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = *r
	p.decides++
	if p.reject != nil {
		return *p.reject, 0
	}
	p.inflight.Add(1)
	return sluice.Decision{Admitted: true, Level: p.level}, 1
}

func (p *probe) Release(_ *sluice.Request, _ sluice.Permit, c sluice.Completion) {
	p.inflight.Add(-1)
	p.released <- c.Outcome
}

func (p *probe) seen() (sluice.Request, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.decides
}

// nextRelease waits for the probe's next release and returns its outcome.
func (p *probe) nextRelease(t *testing.T) sluice.Outcome {
	t.Helper()
	select {
	case o := <-p.released:
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("no release")
		return 0
	}
}

// echo is the test service "sluice.test.Echo": methods Unary, Critical and
// Other (unary) and Stream (bidirectional), each calling the fixture's
// handler functions.
type echo struct {
	mu     sync.Mutex
	unary  func(ctx context.Context, method string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
	stream func(ss grpc.ServerStream) error
}

func (e *echo) handlers() (func(context.Context, string, *wrapperspb.StringValue) (*wrapperspb.StringValue, error), func(grpc.ServerStream) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unary, e.stream
}

func (f *fixture) setUnary(fn func(ctx context.Context, method string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) {
	f.echo.mu.Lock()
	defer f.echo.mu.Unlock()
	f.echo.unary = fn
}

func (f *fixture) setStream(fn func(ss grpc.ServerStream) error) {
	f.echo.mu.Lock()
	defer f.echo.mu.Unlock()
	f.echo.stream = fn
}

func (f *fixture) setOnCall(fn func(attempt int64)) { f.onCall.Store(&fn) }

const service = "sluice.test.Echo"

func unaryMethod(name string) grpc.MethodDesc {
	full := "/" + service + "/" + name
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		unary, _ := srv.(*echo).handlers()
		h := func(ctx context.Context, req any) (any, error) {
			if unary == nil {
				return req, nil
			}
			return unary(ctx, full, req.(*wrapperspb.StringValue))
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}}
}

var streamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

var echoDesc = grpc.ServiceDesc{
	ServiceName: service,
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{unaryMethod("Unary"), unaryMethod("Critical"), unaryMethod("Other")},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, ClientStreams: true, Handler: func(srv any, ss grpc.ServerStream) error {
		if _, stream := srv.(*echo).handlers(); stream != nil {
			return stream(ss)
		}
		return echoStream(ss)
	}}},
}

// echoStream sends back every message until the client closes its side.
func echoStream(ss grpc.ServerStream) error {
	for {
		in := new(wrapperspb.StringValue)
		if err := ss.RecvMsg(in); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(in); err != nil {
			return err
		}
	}
}

// fixture serves echo over loopback behind an outer recording interceptor
// (attempts, panics recovered as INTERNAL) and the interceptor under test,
// deciding with request-rate (token bucket 100/s, burst 5, per tenant),
// tenant-inflight (2 per tenant), pool (service-wide, 2 s retry hint) and
// the probe, on a fake clock.
type fixture struct {
	clk      *fakeClock
	probe    *probe
	chain    *sluice.Chain
	ic       *grpcgate.Interceptor
	echo     *echo
	conn     *grpc.ClientConn
	attempts atomic.Int64 // calls the server saw
	retries  atomic.Int64 // of which carried grpc-previous-rpc-attempts
	panics   atomic.Int64 // recovered by the outer interceptor
	onCall   atomic.Pointer[func(attempt int64)]
}

var (
	noJitter       = &sluice.Jitter{}
	grpcgateJitter = sluice.Jitter{Fraction: 0.5}
)

// testRules identify the tenant from x-api-key, give Critical class
// critical and a cost from x-items (⌈items/10⌉, at most 100), and every
// other method of the service class sheddable.
var testRules = identify.Rules{
	TenantHeader: "x-api-key",
	Routes: []identify.Route{
		{Method: "POST", Path: "/" + service + "/Critical", Class: sluice.ClassCritical,
			Cost: identify.Cost{Header: "x-items", Per: 10, Max: 100}},
		{Path: "/" + service + "/*", Class: sluice.ClassSheddable},
	},
}

func newFixture(t *testing.T, poolSize int64, opts grpcgate.Options, dial ...grpc.DialOption) *fixture {
	t.Helper()
	f := &fixture{clk: newFakeClock(), probe: newProbe(), echo: &echo{}}
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 5)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	c2, _ := limit.NewConcurrency(2)
	tenantIn, _ := gate.NewInFlight("tenant-inflight", memory.NewKeyed(c2, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	cp, _ := limit.NewConcurrency(poolSize)
	pool, _ := gate.NewInFlight("pool", memory.NewKeyed(cp, memory.Options{}), gate.Options{RetryHint: 2 * time.Second})
	var err error
	f.chain, err = sluice.NewChain(sluice.ChainOptions{Clock: f.clk}, rate, tenantIn, pool, f.probe)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Jitter == nil {
		opts.Jitter = noJitter
	}
	if f.ic, err = grpcgate.New(f.chain, opts); err != nil {
		t.Fatal(err)
	}
	f.conn = serve(t, func(s *grpc.Server) { s.RegisterService(&echoDesc, f.echo) },
		[]grpc.ServerOption{
			grpc.ChainUnaryInterceptor(f.outerUnary, f.ic.Unary()),
			grpc.ChainStreamInterceptor(f.outerStream, f.ic.Stream()),
		}, dial...)
	return f
}

// serve starts a gRPC server on a loopback port with the services
// register adds and returns a client connection to it; both end with t.
func serve(t testing.TB, register func(*grpc.Server), sopts []grpc.ServerOption, dial ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(sopts...)
	register(srv)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

// serveBench serves a plain echo with sopts.
func serveBench(b *testing.B, sopts ...grpc.ServerOption) *grpc.ClientConn {
	return serve(b, func(s *grpc.Server) { s.RegisterService(&echoDesc, &echo{}) }, sopts)
}

func (f *fixture) count(ctx context.Context) {
	n := f.attempts.Add(1)
	if len(metadata.ValueFromIncomingContext(ctx, "grpc-previous-rpc-attempts")) > 0 {
		f.retries.Add(1)
	}
	if fn := f.onCall.Load(); fn != nil {
		(*fn)(n)
	}
}

func (f *fixture) outerUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	f.count(ctx)
	defer func() {
		if r := recover(); r != nil {
			f.panics.Add(1)
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return handler(ctx, req)
}

func (f *fixture) outerStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	f.count(ss.Context())
	defer func() {
		if r := recover(); r != nil {
			f.panics.Add(1)
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return handler(srv, ss)
}

// result is what a unary call returned: its error and trailer.
type result struct {
	err     error
	trailer metadata.MD
	header  metadata.MD
}

func (r result) code() codes.Code { return status.Code(r.err) }

// call invokes method ("Unary", "Critical", "Other") with metadata pairs.
func (f *fixture) call(t *testing.T, method string, kv ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return f.callCtx(ctx, method, kv...)
}

func (f *fixture) callCtx(ctx context.Context, method string, kv ...string) result {
	ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	var r result
	out := new(wrapperspb.StringValue)
	r.err = f.conn.Invoke(ctx, "/"+service+"/"+method, wrapperspb.String("hi"), out, grpc.Trailer(&r.trailer), grpc.Header(&r.header))
	return r
}

// one returns the single value of key in md, failing on any other count.
func one(t *testing.T, md metadata.MD, key string) string {
	t.Helper()
	vs := md.Get(key)
	if len(vs) != 1 {
		t.Fatalf("%s: %q (want one value) in %v", key, vs, md)
	}
	return vs[0]
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
