package extauthz_test

import (
	"context"
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/sluice-go/sluice/grpcgate/extauthz"
	"github.com/sluice-go/sluice/policy"
)

// A policy file's chain answers Envoy's checks: the tenant's second
// request in the hour is denied with 429 and RESOURCE_EXHAUSTED.
func ExampleNew() {
	const file = `version: 1
service: orders
identity:
  tenant: {header: X-Api-Key}
routes:
  - {match: {path: /v1/orders/*}, class: critical}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 1}
`
	f, err := policy.Parse("orders.yaml", []byte(file))
	if err != nil {
		panic(err)
	}
	rt, err := policy.Build(f, nil, policy.Options{})
	if err != nil {
		panic(err)
	}
	defer rt.Close()
	srv, _ := extauthz.New(rt.Chain, extauthz.Config{Rules: rt.Rules})
	// On a server: gs := grpc.NewServer(); extauthz.Register(gs, srv)
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/v1/orders/42", Headers: map[string]string{"x-api-key": "acme"}},
	}}}
	for range 2 {
		resp, _ := srv.Check(context.Background(), req)
		if resp.GetOkResponse() != nil {
			fmt.Println("allowed", codes.Code(resp.GetStatus().GetCode()))
			continue
		}
		fmt.Println("denied", codes.Code(resp.GetStatus().GetCode()), resp.GetDeniedResponse().GetStatus().GetCode())
	}
	// Output:
	// allowed OK
	// denied ResourceExhausted TooManyRequests
}
