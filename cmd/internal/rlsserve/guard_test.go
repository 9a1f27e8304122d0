package rlsserve

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/internal/logbuf"
)

// Calls whose message never comes hold at most the server's bound: past
// it a call is refused at once with RESOURCE_EXHAUSTED, the stalled ones
// give their slots back at the call timeout, and then a healthy call is
// served; finished calls give theirs back at once.
func TestStalledCallsAreBounded(t *testing.T) {
	g := &callGuard{max: 100, timeout: 500 * time.Millisecond}
	dial := guardedHealth(t, g)
	healthy := dial()
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(healthy).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for i := range 200 {
		if err := check(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	waitCalls(t, g, 0)

	// 4 connections × 100 calls that never send their message.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := stallCalls(ctx, t, dial, 4, 100)
	refused, timedOut := stalledAnswers(t, streams)
	if timedOut+refused != 400 || timedOut > 100 {
		t.Errorf("%d stalled calls timed out, %d refused: want at most 100 timed out", timedOut, refused)
	}
	if refused < 300 || refused > 300+10 {
		t.Errorf("%d of 400 stalled calls refused past a bound of 100, want about 300", refused)
	}
	if n := g.refused[refusedBound].Load(); n != uint64(refused) {
		t.Errorf("%d refusals at the bound counted, %d answered", n, refused)
	}
	waitCalls(t, g, 0)
	if err := check(); err != nil {
		t.Fatalf("a healthy call after the stall timeout: %v", err)
	}
}

// guardedHealth serves the health service under g on a free loopback
// port until the test ends, and returns a dialer of new connections to it.
func guardedHealth(t *testing.T, g *callGuard) func() *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := newGRPCServer(1, g)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return func() *grpc.ClientConn {
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// stalledAnswers reads each stalled call's answer: refused at once, or
// its deadline.
func stalledAnswers(t *testing.T, streams []grpc.ClientStream) (refused, timedOut int) {
	t.Helper()
	for _, s := range streams {
		var m healthpb.HealthCheckResponse
		switch err := s.RecvMsg(&m); status.Code(err) {
		case codes.ResourceExhausted:
			refused++
		case codes.DeadlineExceeded:
			timedOut++
		default:
			t.Fatalf("a stalled call answered %v", err)
		}
	}
	return refused, timedOut
}

func waitCalls(t *testing.T, g *callGuard, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.calls.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls counted in progress, want %d", g.calls.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The count is taken by the handlers: calls the server ends before a
// handler runs (an unknown method) leave nothing counted, and stalled
// calls with a deadline of their own, shorter than the call timeout (as
// Envoy's calls have), are held to it, counted, and refused past the
// bound.
func TestGuardCountsOnlyHandledCalls(t *testing.T) {
	g := &callGuard{max: 20, timeout: time.Minute}
	c := guardedHealth(t, g)()
	hc := healthpb.NewHealthClient(c)

	for range 200 {
		err := c.Invoke(context.Background(), "/grpc.health.v1.Health/NoSuchMethod", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("an unknown method: %v", err)
		}
	}
	waitCalls(t, g, 0)

	// 60 calls that never send their message, each with 2 s of its own
	// (all are open long before that).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var streams []grpc.ClientStream
	for range 60 {
		s, err := c.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/grpc.health.v1.Health/Check")
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	refused, timedOut := stalledAnswers(t, streams)
	t.Logf("%d held to their deadline, %d refused", timedOut, refused)
	if timedOut > 20 || refused < 40 {
		t.Errorf("%d stalled calls held to their deadline, %d refused: want at most 20 held", timedOut, refused)
	}
	waitCalls(t, g, 0)
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a healthy call after the stalled ones: %v", err)
	}
}

// A call with a deadline of its own within the call timeout keeps its
// context as it is (nothing allocated); one with a later deadline, or
// none, gets the call timeout.
func TestTapBoundsOnlyLongerWaits(t *testing.T) {
	g := &callGuard{max: 1, timeout: time.Second}
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if got, err := g.tap(short, nil); got != short || err != nil {
		t.Errorf("a call with 500 ms of its own got a new context (%v)", err)
	}
	long, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	for _, ctx := range []context.Context{long, context.Background()} {
		got, err := g.tap(ctx, nil)
		if dl, ok := got.Deadline(); err != nil || !ok || time.Until(dl) > time.Second {
			t.Errorf("a call with a later deadline or none keeps it (%v, %v)", dl, ok)
		}
	}
}

// panicky is a health service whose handlers panic.
type panicky struct {
	healthpb.UnimplementedHealthServer
}

func (panicky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("check broke")
}

func (panicky) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	panic("watch broke")
}

// A handler's panic ends its call with INTERNAL, logged with its stack;
// the process goes on serving and the call's slot is given back (grpc-go
// alone would let the panic end the process).
func TestHandlerPanicIsAnsweredInternal(t *testing.T) {
	var logs logbuf.Buffer
	g := &callGuard{max: 10, timeout: time.Second, log: slog.New(slog.NewTextHandler(&logs, nil))}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := newGRPCServer(1, g)
	healthpb.RegisterHealthServer(gs, panicky{})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hc := healthpb.NewHealthClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 20 { // more than the bound: no slot is kept by a panic
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Internal {
			t.Fatalf("call %d of a panicking unary handler: %v, want INTERNAL", i, err)
		}
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("a panicking stream handler: %v, want INTERNAL", err)
	}
	waitCalls(t, g, 0)
	if n := g.refused[refusedPanicked].Load(); n != 21 {
		t.Errorf("%d panics counted, want 21", n)
	}
	out := logs.String()
	for _, want := range []string{"/grpc.health.v1.Health/Check", "check broke", "/grpc.health.v1.Health/Watch", "watch broke", "panicky.Check"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%.2000s", want, out)
		}
	}
}

// One client host's calls hold at most its share of the bound, over any
// number of connections: stalled calls from one address past it are
// refused at once, and another host's calls are served meanwhile, at
// once (before the share, 5,120 calls stalled over 20 connections held
// the whole bound and every other caller was refused until they timed
// out).
func TestOneHostHoldsAtMostItsShare(t *testing.T) {
	g := &callGuard{max: 100, perPeer: 25, timeout: time.Minute}
	dial := guardedHealth(t, g)
	// Another loopback address whose counter is not the stalling host's
	// (their hash is seeded per process).
	bucket := func(ip string) *atomic.Int64 {
		return g.peers.bucket(peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}}))
	}
	other := ""
	for i := 2; i < 50 && other == ""; i++ {
		if ip := fmt.Sprintf("127.0.0.%d", i); bucket(ip) != bucket("127.0.0.1") {
			other = ip
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := stallCalls(ctx, t, dial, 4, 100)
	// The 375 past the share are refused at once; the 25 stay held (a
	// minute) while the other host is served.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // the held calls end
	for _, s := range streams {
		wg.Go(func() {
			var m healthpb.HealthCheckResponse
			s.RecvMsg(&m)
		})
	}
	poll := time.Now().Add(10 * time.Second)
	for g.calls.Load() != 25 || bucket("127.0.0.1").Load() != 25 {
		if time.Now().After(poll) {
			t.Fatalf("%d calls held, %d of them the stalling host's; want its share, 25", g.calls.Load(), bucket("127.0.0.1").Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 50 {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := healthpb.NewHealthClient(dialFrom(t, dial, other)).Check(cctx, &healthpb.HealthCheckRequest{})
		ccancel()
		if err != nil {
			t.Fatalf("call %d from another host while one holds its share: %v", i, err)
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	_, err := healthpb.NewHealthClient(dial()).Check(cctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "client host") {
		t.Errorf("a call of the host at its share: %v, want RESOURCE_EXHAUSTED naming its share", err)
	}
	if n, b := g.refused[refusedHostShare].Load(), g.refused[refusedBound].Load(); n != 376 || b != 0 {
		t.Errorf("refusals counted: %d at the host's share, %d at the bound; want 376 and 0", n, b)
	}
	cancel()
	waitCalls(t, g, 0)
	if n := bucket("127.0.0.1").Load(); n != 0 {
		t.Errorf("the stalling host's count is %d after its calls ended, want 0", n)
	}
}

// dialFrom returns a connection to the server dial connects to, from the
// loopback address local.
func dialFrom(t *testing.T, dial func() *grpc.ClientConn, local string) *grpc.ClientConn {
	t.Helper()
	target := dial().Target()
	c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawCodec sends a call's message as the bytes it is given, and reads the
// answer's as bytes: a client that writes what grpc-go's would refuse to.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *v.(*[]byte) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// A message that does not decode (a string field that is not UTF-8, a
// truncated message) is the caller's fault: INVALID_ARGUMENT naming why,
// as for any other malformed request, not INTERNAL, which grpc-go answers
// and which reads as a fault of the server's; nothing of it is kept.
func TestUndecodableMessagesAreInvalidArguments(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now)})
	for _, c := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"domain not UTF-8", []byte{0x0a, 0x02, 0xff, 0xfe}, "UTF-8"},
		{"truncated", []byte{0x0a, 0x05, 'e'}, "does not decode"},
	} {
		for range 3 {
			var out []byte
			err := r.conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &c.msg, &out, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", c.name, err, c.want)
			}
		}
	}
	got, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a")))
	if err != nil || got.GetOverallCode() != okCode {
		t.Fatalf("after the undecodable calls: %v %v", got, err)
	}
	if n := r.grpc.guard.codec.pending.Load(); n != 0 {
		t.Errorf("%d undecodable messages kept after their calls, want 0", n)
	}
	// A streaming call's message too (health's Watch).
	bad := []byte{0x0a, 0x02, 0xff, 0xfe}
	s, err := r.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, "/grpc.health.v1.Health/Watch", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendMsg(&bad); err != nil {
		t.Fatal(err)
	}
	s.CloseSend()
	var out []byte
	if err := s.RecvMsg(&out); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a streaming call's undecodable message: %v, want INVALID_ARGUMENT", err)
	}
	// Each is counted where an operator looks (no service's own counter
	// sees them: the call ends before its handler reads a message).
	if n := metric(t, r, "sluice_grpc_refused_total", `reason="undecodable"`); n != 7 {
		t.Errorf("sluice_grpc_refused_total{reason=\"undecodable\"} = %v, want 7", n)
	}
}

// stallCalls opens n calls that never send their message on each of conns
// new connections, until ctx ends.
func stallCalls(ctx context.Context, t *testing.T, dial func() *grpc.ClientConn, conns, n int) []grpc.ClientStream {
	t.Helper()
	var streams []grpc.ClientStream
	for range conns {
		c := dial()
		for range n {
			s, err := c.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/grpc.health.v1.Health/Check")
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
	}
	return streams
}

// An undecodable message whose call ends before grpc-go's read past it
// (the client cancels before it half-closes, or sends a second message)
// leaves nothing kept: the error was kept for good, a message's worth of
// memory a call (a remote leak, with messages of up to 1 MiB).
func TestUndecodableMessagesOfCancelledCallsAreNotKept(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now)})
	bad := []byte{0x0a, 0x02, 0xff, 0xfe}
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := r.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(&bad); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			s.SendMsg(&bad) // a second message: the cardinality violation
		}
		time.Sleep(5 * time.Millisecond) // the server decodes it and waits for the end
		cancel()
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.grpc.guard.codec.pending.Load() != 0 || r.grpc.InProgress() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d undecodable messages kept, %d calls in progress, after every call ended; want none", r.grpc.guard.codec.pending.Load(), r.grpc.InProgress())
		}
		time.Sleep(5 * time.Millisecond)
	}
	n := 0
	r.grpc.guard.codec.bad.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d entries left in the map", n)
	}
}

// The codec counts the messages it keeps an error for, once each, however
// often one is decoded into, and keeps none past maxPending.
func TestDecodeCodecCountsWhatItKeeps(t *testing.T) {
	c := newDecodeCodec()
	bad := mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x02, 0xff, 0xfe})}
	m := &rlspb.RateLimitRequest{}
	for range 2 {
		if err := c.Unmarshal(bad, m); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.pending.Load(); n != 1 {
		t.Errorf("one message decoded into twice: %d kept, want 1", n)
	}
	if c.undecoded(m) == nil || c.undecoded(m) != nil || c.pending.Load() != 0 {
		t.Errorf("the error is not given back exactly once (%d kept after)", c.pending.Load())
	}
	c.pending.Store(maxPending)
	if err := c.Unmarshal(bad, &rlspb.RateLimitRequest{}); err == nil {
		t.Error("past maxPending an undecodable message was kept, want grpc-go's error")
	}
}

// A client host's counter is its IP address's, an IPv6 client's /64's
// (one host may hold all of it), and an IPv4 address's whether it comes
// plain or mapped into IPv6; a peer that is no IP address counts on one.
func TestPeerBuckets(t *testing.T) {
	var p peerCounts
	p.seed = maphash.MakeSeed()
	of := func(a net.Addr) *atomic.Int64 {
		return p.bucket(peer.NewContext(context.Background(), &peer.Peer{Addr: a}))
	}
	tcp := func(ip string) *atomic.Int64 { return of(&net.TCPAddr{IP: net.ParseIP(ip), Port: 1}) }
	if tcp("2001:db8:1:2::1") != tcp("2001:db8:1:2:ffff::9") {
		t.Error("two addresses of one /64 count apart")
	}
	if tcp("192.0.2.7") != tcp("::ffff:192.0.2.7") {
		t.Error("an IPv4 address counts apart from itself mapped into IPv6")
	}
	if of(&net.UnixAddr{Name: "a"}) != of(&net.UnixAddr{Name: "b"}) {
		t.Error("two Unix socket peers count apart")
	}
	apart := 0
	for i := range 20 { // other /64s: apart but for a hash collision (one in 4,096 each)
		if tcp(fmt.Sprintf("2001:db8:1:%x::1", 100+i)) != tcp("2001:db8:1:2::1") {
			apart++
		}
	}
	if apart < 19 {
		t.Errorf("%d of 20 other /64s count apart from one, want all but a collision", apart)
	}
}
