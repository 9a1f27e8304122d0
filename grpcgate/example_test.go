package grpcgate_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// A gRPC server behind a per-tenant token bucket of one call per hour:
// the tenant's second call is refused with RESOURCE_EXHAUSTED and a
// pushback trailer, before the handler runs.
func ExampleNew() {
	perHour, _ := limit.ParseRate("1/h")
	tb, _ := limit.NewTokenBucket(perHour, 1)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}),
		gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate)
	ic, err := grpcgate.New(chain, grpcgate.Options{Rules: identify.Rules{
		TenantHeader: "x-api-key",
		Routes:       []identify.Route{{Path: "/grpc.health.v1.Health/*", Class: sluice.ClassCritical}},
	}})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()
	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()

	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "acme")
	for range 2 {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		fmt.Println(status.Code(err), len(trailer.Get(grpcgate.PushbackKey)) == 1)
	}
	// Output:
	// OK false
	// ResourceExhausted true
}
