package envoyrls_test

import (
	"context"
	"testing"
	"time"

	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/grpcgate/envoyrls"
	"github.com/sluice-go/sluice/grpcgate/rls"
)

// benchRequest is a typical Envoy call: two descriptors of two and three
// entries, one with an override and one with its own hits.
func benchRequest() *rlspb.RateLimitRequest {
	d1 := desc("tenant", "t42", "path", "/v1/orders")
	d1.Limit = &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}
	d2 := desc("tenant", "t42", "method", "POST", "remote_address", "10.0.0.1")
	d2.HitsAddend = wrapperspb.UInt64(2)
	return &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*descpb.RateLimitDescriptor{d1, d2}}
}

var benchResponse = &rls.Response{
	Overall: rls.CodeOK,
	Statuses: []rls.Status{
		{Code: rls.CodeOK, Limit: &rls.Limit{Name: "per-tenant-path", RequestsPerUnit: 100, Unit: rls.Minute}, Remaining: 57, ResetIn: 23 * time.Second},
		{Code: rls.CodeOK, Limit: &rls.Limit{Name: "per-address", RequestsPerUnit: 1000, Unit: rls.Hour}, Remaining: 998, ResetIn: 20 * time.Minute},
	},
	Headers: []rls.Header{{Name: "RateLimit", Value: `"per-tenant-path";r=57;t=23`}},
}

// BenchmarkTranslate: DecodeRequest and EncodeResponse of a typical call,
// the adapter's whole translation cost.
func BenchmarkTranslate(b *testing.B) {
	req := benchRequest()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := envoyrls.DecodeRequest(req); err != nil {
			b.Fatal(err)
		}
		envoyrls.EncodeResponse(benchResponse)
	}
}

type fixedService struct{}

func (fixedService) ShouldRateLimit(context.Context, *rls.Request) (*rls.Response, error) {
	return benchResponse, nil
}

// BenchmarkShouldRateLimit: the handler as gRPC calls it (size check,
// translation both ways) over a service that answers at once.
func BenchmarkShouldRateLimit(b *testing.B) {
	srv, _ := envoyrls.New(fixedService{}, envoyrls.Options{})
	req, ctx := benchRequest(), context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShouldRateLimitTransportBound: the handler without its own
// size check (MaxRequestBytes -1), for a server whose transport bounds the
// message (grpc.MaxRecvMsgSize, as `sluice serve` does): the difference
// with BenchmarkShouldRateLimit is proto.Size of each request.
func BenchmarkShouldRateLimitTransportBound(b *testing.B) {
	srv, _ := envoyrls.New(fixedService{}, envoyrls.Options{MaxRequestBytes: -1})
	req, ctx := benchRequest(), context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
