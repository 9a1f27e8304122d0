package grpcgate_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

// refuser is a gate that refuses the first n decisions with decision d.
type refuser struct {
	mu sync.Mutex
	n  int
	d  sluice.Decision
}

func (g *refuser) Name() string { return "refuser" }

func (g *refuser) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

func (g *refuser) decide(context.Context, *sluice.Request, clock.Instant) (sluice.Decision, sluice.Permit) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n > 0 {
		g.n--
		return g.d, 0
	}
	return sluice.Decision{Admitted: true}, 0
}

func (g *refuser) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// clientFixture serves echo behind grpcgate's server interceptors with the
// refuser, and dials it through the client interceptors over a Retrier on
// a fake clock whose sleeps are recorded. ids records the x-request-id of
// every attempt the server saw.
type clientFixture struct {
	conn  *grpc.ClientConn
	gate  *refuser
	mu    sync.Mutex
	ids   []string
	waits []time.Duration
}

func newClientFixture(t *testing.T, refusals int, d sluice.Decision) *clientFixture {
	t.Helper()
	f := &clientFixture{gate: &refuser{n: refusals, d: d}}
	chain, err := sluice.NewChain(sluice.ChainOptions{}, f.gate)
	must(t, err)
	ic, err := grpcgate.New(chain, grpcgate.Options{Jitter: noJitter})
	must(t, err)
	record := func(ctx context.Context) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ids = append(f.ids, metadata.ValueFromIncomingContext(ctx, "x-request-id")...)
	}
	clk := fakeclock.New(int64(time.Hour))
	r, err := client.New(client.Options{Clock: clk, Rand: rand.NewPCG(1, 2), ThrottleK: -1,
		Sleep: func(ctx context.Context, d time.Duration) error {
			f.mu.Lock()
			f.waits = append(f.waits, d)
			f.mu.Unlock()
			clk.Advance(d)
			return ctx.Err()
		}})
	must(t, err)
	f.conn = serve(t, func(s *grpc.Server) { s.RegisterService(&echoDesc, &echo{}) },
		[]grpc.ServerOption{
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				record(ctx)
				return h(ctx, req)
			}, ic.Unary()),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				record(ss.Context())
				return h(srv, ss)
			}, ic.Stream()),
		},
		grpc.WithDisableRetry(),
		grpc.WithUnaryInterceptor(grpcgate.UnaryClientInterceptor(r, grpcgate.ClientOptions{})),
		grpc.WithStreamInterceptor(grpcgate.StreamClientInterceptor(r, grpcgate.ClientOptions{})))
	return f
}

var overload = sluice.Decision{Reason: sluice.ReasonOverload, Retryable: true, RetryAfter: time.Second, Gate: "refuser"}

// A sluice refusal (UNAVAILABLE, no effect, pushback 1000 ms) is retried
// after the pushback jittered upward, with the same request id, for a
// method that is not idempotent.
func TestClientUnaryRetriesPushback(t *testing.T) {
	f := newClientFixture(t, 1, overload)
	out := new(wrapperspb.StringValue)
	if err := f.conn.Invoke(context.Background(), "/"+service+"/Unary", wrapperspb.String("hi"), out); err != nil || out.Value != "hi" {
		t.Fatalf("%v %q", err, out.Value)
	}
	if len(f.ids) != 2 || f.ids[0] == "" || f.ids[0] != f.ids[1] {
		t.Fatalf("request ids %q: want the same one on both attempts", f.ids)
	}
	if len(f.waits) != 1 || f.waits[0] < time.Second || f.waits[0] > 2*time.Second {
		t.Fatalf("waits %v: want one in [1s, 2s]", f.waits)
	}
}

// "Do not retry" (pushback -1) is one attempt; the status comes back.
func TestClientUnaryNotRetryable(t *testing.T) {
	d := overload
	d.Retryable = false
	f := newClientFixture(t, 1, d)
	err := f.conn.Invoke(context.Background(), "/"+service+"/Unary", wrapperspb.String("hi"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.Unavailable || len(f.ids) != 1 {
		t.Fatalf("%v after %d attempts", err, len(f.ids))
	}
}

// The attempt limit: three refusals, three attempts (the default), then
// the last refusal.
func TestClientUnaryAttemptLimit(t *testing.T) {
	f := newClientFixture(t, 10, sluice.Decision{Reason: sluice.ReasonPolicyRate, Retryable: true, RetryAfter: 10 * time.Millisecond, Gate: "refuser"})
	err := f.conn.Invoke(context.Background(), "/"+service+"/Unary", wrapperspb.String("hi"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.ResourceExhausted || len(f.ids) != 3 {
		t.Fatalf("%v after %d attempts", err, len(f.ids))
	}
}

// A stream refused before its first answer is opened again and its sent
// messages replayed; it then echoes.
func TestClientStreamRetries(t *testing.T) {
	f := newClientFixture(t, 1, overload)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := f.conn.NewStream(ctx, &streamDesc, "/"+service+"/Stream")
	must(t, err)
	must(t, cs.SendMsg(wrapperspb.String("one")))
	must(t, cs.CloseSend())
	out := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(out); err != nil || out.Value != "one" {
		t.Fatalf("%v %q", err, out.Value)
	}
	if err := cs.RecvMsg(out); err == nil {
		t.Fatal("a second message")
	}
	if len(f.ids) != 2 || f.ids[0] != f.ids[1] || len(f.waits) != 1 {
		t.Fatalf("ids %q, waits %v", f.ids, f.waits)
	}
}

// A message sent after the first attempt was refused (the refusal ends
// the stream at its start, and grpc-go's SendMsg then answers io.EOF) is
// kept and replayed, not reported: the caller sees only the retried
// stream's answer. Header waits for the refusal here; under load it used
// to race the first SendMsg, which failed with EOF.
func TestClientStreamSendAfterTheRefusalIsReplayed(t *testing.T) {
	for _, refusals := range []int{1, 2} {
		f := newClientFixture(t, refusals, overload)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := f.conn.NewStream(ctx, &streamDesc, "/"+service+"/Stream")
		must(t, err)
		if md, err := cs.Header(); md != nil || err != nil {
			t.Fatalf("refused stream's header: %v, %v", md, err)
		}
		must(t, cs.SendMsg(wrapperspb.String("one")))
		must(t, cs.CloseSend())
		out := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(out); err != nil || out.Value != "one" {
			t.Fatalf("%d refusals: %v %q", refusals, err, out.Value)
		}
		if len(f.ids) != refusals+1 {
			t.Fatalf("%d refusals: ids %q", refusals, f.ids)
		}
		cancel()
	}
}

// A local rejection is UNAVAILABLE and matches client.ErrLocal.
func TestClientLocalRejection(t *testing.T) {
	r, err := client.New(client.Options{ThrottleMin: -1, MaxAttempts: 1, Rand: rand.NewPCG(1, 1)})
	must(t, err)
	ic := grpcgate.UnaryClientInterceptor(r, grpcgate.ClientOptions{})
	refused := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		return status.Error(codes.Unavailable, "busy")
	}
	var last error
	for range 50 {
		last = ic(context.Background(), "/x.Y/Z", nil, nil, nil, refused)
		if errors.Is(last, client.ErrLocal) {
			break
		}
	}
	if !errors.Is(last, client.ErrThrottled) || status.Code(last) != codes.Unavailable {
		t.Fatalf("after 50 failures: %v (code %v)", last, status.Code(last))
	}
}

// healthyConn dials an echo server (no gate) through the client
// interceptors over r, with opts.
func healthyConn(t *testing.T, r *client.Retrier, opts grpcgate.ClientOptions) *grpc.ClientConn {
	t.Helper()
	return serve(t, func(s *grpc.Server) { s.RegisterService(&echoDesc, &echo{}) }, nil,
		grpc.WithDisableRetry(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(8<<20)),
		grpc.WithStreamInterceptor(grpcgate.StreamClientInterceptor(r, opts)))
}

// One goroutine sends while another receives, as grpc-go allows: a send
// blocked on flow control must not keep the receiver from draining the
// answers that would unblock it (SendMsg held the stream's lock while it
// sent, and RecvMsg waited for it: no echo of 32 MiB came back).
func TestClientStreamSendsWhileReceiving(t *testing.T) {
	r, err := client.New(client.Options{})
	must(t, err)
	conn := healthyConn(t, r, grpcgate.ClientOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := conn.NewStream(ctx, &streamDesc, "/"+service+"/Stream")
	must(t, err)
	const n = 32
	big := wrapperspb.String(string(make([]byte, 1<<20)))
	sent := make(chan error, 1)
	go func() {
		for range n {
			if err := cs.SendMsg(big); err != nil {
				sent <- err
				return
			}
		}
		sent <- cs.CloseSend()
	}()
	got := 0
	for {
		out := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(out); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("after %d echoes: %v", got, err)
			}
			break
		}
		got++
	}
	if err := <-sent; err != nil || got != n {
		t.Fatalf("send: %v; %d echoes of %d", err, got, n)
	}
}

// Healthy streams count as accepted by the adaptive throttle, also when
// the caller reads the header first or sends more than it can replay
// (both committed the stream without telling the throttle, which took
// every such stream for a refusal and soon refused them locally).
func TestClientStreamsCountAsAccepted(t *testing.T) {
	r, err := client.New(client.Options{})
	must(t, err)
	conn := healthyConn(t, r, grpcgate.ClientOptions{MaxReplay: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 100 {
		cs, err := conn.NewStream(ctx, &streamDesc, "/"+service+"/Stream")
		if err != nil {
			t.Fatalf("stream %d: %v (throttle p = %v)", i, err, r.ThrottleProbability())
		}
		for range 1 + i%2*4 { // odd streams send 5, more than the 2 kept
			must(t, cs.SendMsg(wrapperspb.String("x")))
		}
		must(t, cs.CloseSend())
		if i%2 == 0 { // the header first (the echo sends it with its first answer)
			if _, err := cs.Header(); err != nil {
				t.Fatal(err)
			}
		}
		for {
			if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	if p := r.ThrottleProbability(); p != 0 {
		t.Fatalf("throttle p = %v after 100 healthy streams", p)
	}
}
