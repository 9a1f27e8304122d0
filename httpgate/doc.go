// Package httpgate is sluice as net/http middleware: it identifies each
// request with server-side rules (tenant from a configured header, class and
// cost from route rules, deadline from a budget header), runs the gate chain,
// and answers rejections cheaply and honestly (429 for entitlement, 503 for
// protection, Retry-After with jitter, RateLimit fields, a small JSON
// envelope), releasing every admitted request's Ticket on every path.
//
//	mw, _ := httpgate.New(chain, httpgate.Config{Rules: identify.Rules{
//		TenantHeader:   "X-Api-Key",
//		DeadlineHeader: "X-Request-Timeout",
//		Routes: []identify.Route{
//			{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical,
//				Cost: identify.Cost{Header: "X-Stops", Per: 100, Min: 1, Max: 50}},
//			{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
//		},
//	}})
//	http.ListenAndServe(":8080", mw.Wrap(app))
//
// Where nginx or Envoy stays on the data path, DecisionHandler answers the
// same decisions as an endpoint for nginx auth_request and Envoy ext_authz
// (HTTP service mode): 200 to admit, or the middleware's own rejection.
//
//	h, _ := mw.DecisionHandler(httpgate.DecisionConfig{}) // X-Original-Method, X-Original-URI
//	http.ListenAndServe("127.0.0.1:8081", h)
package httpgate
