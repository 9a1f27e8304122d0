package envoyrls_test

import (
	"context"
	"fmt"

	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-go/sluice/grpcgate/envoyrls"
	"github.com/sluice-go/sluice/grpcgate/rls"
)

// serviceFunc is an rls.Service in a function.
type serviceFunc func(context.Context, *rls.Request) (*rls.Response, error)

func (f serviceFunc) ShouldRateLimit(ctx context.Context, r *rls.Request) (*rls.Response, error) {
	return f(ctx, r)
}

// The adapter translates a ShouldRateLimit call for the service and its
// answer back; here the service says OVER_LIMIT for tenant "t42", with a
// weekly limit (a unit only responses have).
func ExampleNew() {
	svc := serviceFunc(func(_ context.Context, r *rls.Request) (*rls.Response, error) {
		resp := &rls.Response{Overall: rls.CodeOK}
		for _, d := range r.Descriptors {
			st := rls.Status{Code: rls.CodeOK, Limit: &rls.Limit{Name: "weekly", RequestsPerUnit: 1000, Unit: rls.Week}}
			if d.Entries[0].Value == "t42" {
				st.Code, resp.Overall = rls.CodeOverLimit, rls.CodeOverLimit
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		return resp, nil
	})
	srv, _ := envoyrls.New(svc, envoyrls.Options{})
	// On a server: gs := grpc.NewServer(srv.ServerOptions()...); envoyrls.Register(gs, srv)
	resp, err := srv.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{
		Domain: "edge",
		Descriptors: []*descpb.RateLimitDescriptor{{Entries: []*descpb.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: "t42"},
		}}},
	})
	fmt.Println(err, resp.OverallCode, resp.Statuses[0].CurrentLimit.Unit)
	// Output: <nil> OVER_LIMIT WEEK
}
