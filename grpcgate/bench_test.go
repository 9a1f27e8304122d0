package grpcgate_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// transportStream is the least a server context needs for SetTrailer.
type transportStream struct{ trailer metadata.MD }

func (s *transportStream) Method() string                  { return "/" + service + "/Unary" }
func (s *transportStream) SetHeader(metadata.MD) error     { return nil }
func (s *transportStream) SendHeader(metadata.MD) error    { return nil }
func (s *transportStream) SetTrailer(md metadata.MD) error { s.trailer = md; return nil }

func benchInterceptor(b *testing.B, rate string, burst int64) {
	r, _ := limit.ParseRate(rate)
	tb, _ := limit.NewTokenBucket(r, burst)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	ic, err := grpcgate.New(chain, grpcgate.Options{Rules: identify.Rules{TenantHeader: "x-api-key"}, Jitter: &sluice.DefaultJitter})
	if err != nil {
		b.Fatal(err)
	}
	unary := ic.Unary()
	ts := &transportStream{}
	ctx := grpc.NewContextWithServerTransportStream(
		metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "tenant-42")), ts)
	info := &grpc.UnaryServerInfo{FullMethod: "/" + service + "/Unary"}
	req := wrapperspb.String("hi")
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		unary(ctx, req, info, handler)
	}
}

// BenchmarkUnaryAdmitted: the interceptor in front of a handler that does
// nothing, for an admitted call (identify, decide, the RateLimit trailer,
// release), in process.
func BenchmarkUnaryAdmitted(b *testing.B) { benchInterceptor(b, "1e9/s", 1e9) }

// BenchmarkUnaryRejected: the refusal of a tenant over its limit (status
// with ErrorInfo and RetryInfo, pushback and RateLimit trailer).
func BenchmarkUnaryRejected(b *testing.B) { benchInterceptor(b, "1/h", 1) }

// BenchmarkUnaryBare: the same handler called without the interceptor.
func BenchmarkUnaryBare(b *testing.B) {
	ctx := context.Background()
	req := wrapperspb.String("hi")
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	var sink any
	for b.Loop() {
		sink, _ = handler(ctx, req)
	}
	_ = sink
}

// benchLoopback times a unary call to a no-op handler over a loopback
// connection, with the given server interceptors.
func benchLoopback(b *testing.B, sopts ...grpc.ServerOption) {
	conn := serveBench(b, sopts...)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "tenant-42")
	in, out := wrapperspb.String("hi"), new(wrapperspb.StringValue)
	conn.Invoke(ctx, "/"+service+"/Unary", in, out)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		conn.Invoke(ctx, "/"+service+"/Unary", in, out)
	}
}

func loopbackInterceptor(b *testing.B, rate string, burst int64, opts ...grpcgate.Options) grpc.ServerOption {
	r, _ := limit.ParseRate(rate)
	tb, _ := limit.NewTokenBucket(r, burst)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	o := grpcgate.Options{}
	if len(opts) > 0 {
		o = opts[0]
	}
	o.Rules.TenantHeader = "x-api-key"
	u, err := grpcgate.UnaryServerInterceptor(chain, o)
	if err != nil {
		b.Fatal(err)
	}
	return grpc.UnaryInterceptor(u)
}

// BenchmarkLoopbackBare: a unary call over loopback without sluice.
func BenchmarkLoopbackBare(b *testing.B) { benchLoopback(b) }

// BenchmarkLoopbackAdmitted: the same call through the interceptor,
// admitted.
func BenchmarkLoopbackAdmitted(b *testing.B) {
	benchLoopback(b, loopbackInterceptor(b, "1e9/s", 1e9))
}

// BenchmarkLoopbackRejected: the same call refused by the interceptor.
func BenchmarkLoopbackRejected(b *testing.B) {
	benchLoopback(b, loopbackInterceptor(b, "1/h", 1))
}

// BenchmarkLoopbackRejectedNoDetails: refused without status details.
func BenchmarkLoopbackRejectedNoDetails(b *testing.B) {
	benchLoopback(b, loopbackInterceptor(b, "1/h", 1, grpcgate.Options{NoStatusDetails: true}))
}

// BenchmarkLoopbackBareError: a call over loopback whose handler fails at
// once with RESOURCE_EXHAUSTED, without sluice: what any refusal costs
// gRPC.
func BenchmarkLoopbackBareError(b *testing.B) {
	benchLoopback(b, grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.ResourceExhausted, "request-rate: rate limit exceeded")
	}))
}

// BenchmarkLoopbackAdmittedNoMetadata: admitted, without the RateLimit
// trailer (Options.NoRateLimitMetadata).
func BenchmarkLoopbackAdmittedNoMetadata(b *testing.B) {
	benchLoopback(b, loopbackInterceptor(b, "1e9/s", 1e9, grpcgate.Options{NoRateLimitMetadata: true}))
}
