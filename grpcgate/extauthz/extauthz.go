// Package extauthz answers Envoy's external authorization protocol
// (envoy.service.auth.v3.Authorization/Check) with a sluice Chain: an Envoy
// in front of a service asks before forwarding each request, and gets an
// OK with the RateLimit fields to add, or a denial as httpgate would have
// answered it (429 or 503 with Retry-After, the RateLimit fields and the
// JSON envelope).
//
//	rt, _ := policy.Build(file, nil, policy.Options{})
//	srv, _ := extauthz.New(rt.Chain, extauthz.Config{Rules: rt.Rules})
//	gs := grpc.NewServer()
//	extauthz.Register(gs, srv)
//	gs.Serve(lis)
//
// A check is identified from its HTTP attributes with the rules of package
// identify, as httpgate identifies a request: method, path (the request
// target without its query, percent-decoded once as net/http decodes
// URL.Path), headers (Envoy sends their names in lower case) and, with
// Config.SourceTenant, the source address as the tenant of requests
// without the tenant header.
//
// # Completion is not observable
//
// The protocol has no call for the end of a request: the server never
// learns when, or how, the request it admitted finished. So Check releases
// every admitted request's Ticket at once, with sluice.OutcomeCancelled,
// the outcome learning gates ignore (adaptive limits and deadline and queue
// estimates learn no latency from it; rate gates refund nothing, so the
// rate was spent). Rate gates therefore work as in process; gates that hold
// a slot for a request's life (in-flight limits, adaptive limits, wait
// queues, concurrency leases) would bound concurrent checks, not
// concurrent requests, which is no limit at all. New refuses chains with
// such gates unless Config.AllowConcurrencyGates says the caller knows;
// bound concurrency in the service itself (httpgate, grpcgate). Gates that
// learn from completions without holding slots are not detected and learn
// nothing true here either: a degradation ladder sees every request end at
// once, a deadline gate learns no service time (it admits on what it
// knew), a utilization shedder counting its own in-flight requests sees
// none (give it a Source). The metrics of the chain count every admitted
// check as cancelled.
//
// # gRPC requests
//
// A denied gRPC request (content-type application/grpc) also gets
// grpcgate's grpc-retry-pushback-ms header, meant for the gRPC client to
// read from Envoy's local reply, which for a gRPC request is a single
// header block (Trailers-Only; not tested against a running Envoy here).
// Envoy chooses that reply's grpc-status
// itself from the HTTP status with the HTTP-to-gRPC table of
// grpc/grpc doc/http-grpc-status-mapping.md (429 and 503 both become
// UNAVAILABLE; the filter passes no gRPC status of its own to its local
// reply), so behind Envoy a gRPC caller over its entitlement sees
// UNAVAILABLE, not the RESOURCE_EXHAUSTED grpcgate's interceptors answer.
//
// Sources: envoy/service/auth/v3/external_auth.proto and
// attribute_context.proto in github.com/envoyproxy/envoy (api/), Envoy's
// gRPC client of them,
// source/extensions/filters/common/ext_authz/ext_authz_grpc_impl.cc, and
// its HTTP filter, source/extensions/filters/http/ext_authz/ext_authz.cc:
// a status other than OK denies, the denied response's HTTP status
// replaces the default 403, and each header's append_action says how it is
// applied.
package extauthz

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
)

// Header names the server writes.
const (
	hRetryAfter      = "Retry-After"
	hRateLimit       = "RateLimit"
	hRateLimitPolicy = "RateLimit-Policy"
	hLegacyLimit     = "X-RateLimit-Limit"
	hLegacyRemaining = "X-RateLimit-Remaining"
	hLegacyReset     = "X-RateLimit-Reset"
	// LevelHeader carries a degradation level that is not normal, on the
	// response and on the request forwarded upstream (so the service can
	// serve the cheaper result); a client's own is removed from the
	// forwarded request.
	LevelHeader = "Sluice-Level"
)

// Config is how checks are identified (the server-side rules of package
// identify) and answered. The zero value is valid: one anonymous tenant,
// class "default", cost 1, RateLimit fields on, default jitter.
type Config struct {
	identify.Rules
	// SourceTenant makes the source address (its IP, without the port)
	// the tenant of requests that carry no tenant header (and need not),
	// so that anonymous traffic is counted per client address rather than
	// shared.
	SourceTenant bool
	// AllowConcurrencyGates accepts a chain with gates that hold a slot
	// for a request's life, whose slots are freed at once (see the package
	// documentation).
	AllowConcurrencyGates bool
	// NoRateLimitHeaders turns off RateLimit-Policy and RateLimit.
	NoRateLimitHeaders bool
	// LegacyHeaders adds X-RateLimit-Limit, -Remaining and -Reset to the
	// RateLimit field, on allowed and denied answers alike.
	LegacyHeaders bool
	// HideCapacity leaves quota figures out of headers and messages.
	HideCapacity bool
	// ProblemDetails answers a denial's body as an RFC 9457 problem details
	// object (application/problem+json) instead of the JSON envelope, as
	// httpgate.Config.ProblemDetails does; status and headers unchanged.
	ProblemDetails bool
	// Jitter spreads Retry-After values. Nil: sluice.DefaultJitter; a zero
	// Jitter turns it off.
	Jitter *sluice.Jitter
}

// Server is an envoy.service.auth.v3.Authorization server deciding with a
// sluice Chain. The chain and config can be replaced at run time with
// Update. It is safe for concurrent use.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	state    atomic.Pointer[state]
	idPrefix string
	ids      atomic.Uint64
}

type state struct {
	chain  *sluice.Chain
	cfg    Config
	id     *identify.Identifier
	jitter sluice.Jitter
	keys   []hdrKey // the headers identification reads
	policy string   // RateLimit-Policy value, "" for none
}

// hdrKey is a header identification reads: the lower-case name Envoy sends
// and the canonical name the rules look up.
type hdrKey struct {
	lower, canon string
	// joined: a field read as one value (a tenant header), which Envoy's
	// headers map gives repeated fields of joined by ",": the value is
	// split there, so a repeat is refused as over HTTP (a second value
	// made a fresh tenant key of every request).
	joined bool
}

// ErrConcurrencyGate is returned by New and Update for a chain with a gate
// that holds slots, unless Config.AllowConcurrencyGates is set.
var ErrConcurrencyGate = errors.New("extauthz: a gate that holds a slot per request cannot see requests end through ext_authz")

// New returns a server deciding with chain under cfg. It returns an error
// for a nil chain, rules package identify refuses, and a chain with a gate
// that holds slots (ErrConcurrencyGate) unless cfg allows it.
func New(chain *sluice.Chain, cfg Config) (*Server, error) {
	var seed [4]byte
	crand.Read(seed[:])
	s := &Server{idPrefix: hex.EncodeToString(seed[:]) + "-"}
	if err := s.Update(chain, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Register registers srv on g as envoy.service.auth.v3.Authorization.
func Register(g grpc.ServiceRegistrar, srv *Server) { authv3.RegisterAuthorizationServer(g, srv) }

// Update replaces the chain and config atomically, with New's checks.
func (s *Server) Update(chain *sluice.Chain, cfg Config) error {
	if chain == nil {
		return errors.New("extauthz: nil chain")
	}
	if !cfg.AllowConcurrencyGates {
		for _, g := range chain.Gates() {
			if holdsSlots(g) {
				return fmt.Errorf("%w: gate %q (set AllowConcurrencyGates to accept it)", ErrConcurrencyGate, g.Name())
			}
		}
	}
	id, err := identify.New(cfg.Rules)
	if err != nil {
		return err
	}
	cfg.Rules = id.Rules()
	st := &state{chain: chain, cfg: cfg, id: id, jitter: sluice.DefaultJitter}
	if cfg.Jitter != nil {
		st.jitter = *cfg.Jitter
	}
	// Every header identification reads (the client's forwarding header
	// and the trusted peers' Sluice-Class included: they were left out,
	// and every client behind a proxy shared its bucket), and the
	// content type, for gRPC's pushback.
	single := map[string]bool{http.CanonicalHeaderKey(cfg.TenantHeader): cfg.TenantHeader != ""}
	for _, p := range cfg.Tenant.Parts {
		if p.Source == identify.SourceHeader {
			single[http.CanonicalHeaderKey(p.Name)] = true
		}
	}
	for _, name := range append(id.Headers(), "Content-Type") {
		canon := http.CanonicalHeaderKey(name)
		st.keys = append(st.keys, hdrKey{lower: strings.ToLower(name), canon: canon, joined: single[canon]})
	}
	if ps := chain.Policies(); len(ps) > 0 && !cfg.NoRateLimitHeaders && !cfg.HideCapacity {
		st.policy = string(wire.AppendPolicies(nil, ps))
	}
	s.state.Store(st)
	return nil
}

// holdsSlots reports whether g holds something for a request's life: a
// quota of concurrent requests, an adaptive limit or a wait queue.
func holdsSlots(g sluice.Gate) bool {
	if a, ok := sluice.As[sluice.Advertiser](g); ok && a.Policy().Unit == sluice.UnitConcurrentRequests {
		return true
	}
	if _, ok := sluice.As[sluice.Sizer](g); ok {
		return true
	}
	_, ok := sluice.As[sluice.Queuer](g)
	return ok
}

// Chain returns the chain currently deciding.
func (s *Server) Chain() *sluice.Chain { return s.state.Load().chain }

// Check decides the request a CheckRequest describes. It never fails: an
// admitted request is an OK status with an OkHttpResponse adding the
// RateLimit fields to the response; a refused one a status of
// grpcgate.Code (RESOURCE_EXHAUSTED, UNAVAILABLE, INVALID_ARGUMENT) with a
// DeniedHttpResponse of httpgate's answer (400, 429 or 503, its headers and
// JSON envelope). Nil messages in the request read as empty.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	st := s.state.Load()
	attrs := req.GetAttributes()
	hr := attrs.GetRequest().GetHttp()
	h := st.header(hr)
	rid, ridOK := st.id.RequestID(h)
	grpcReq := strings.HasPrefix(h.Get("Content-Type"), "application/grpc")

	var r sluice.Request
	path, ok := requestPath(hr.GetPath())
	if !ok {
		return s.refuse(st, st.chain.Refuse(&r, sluice.Decision{Reason: sluice.ReasonInvalid}), &r, "malformed request path", rid, ridOK, grpcReq), nil
	}
	// The peer is Envoy's downstream, the client or what stands in
	// front of Envoy (then trusted_proxies and its X-Forwarded-For).
	in := identify.Input{Method: hr.GetMethod(), Path: path, Header: h, RawQuery: hr.GetQuery()}
	if _, q, ok := strings.Cut(hr.GetPath(), "?"); ok && in.RawQuery == "" { // Envoy before the query field
		in.RawQuery, _, _ = strings.Cut(q, "#")
	}
	if sa := attrs.GetSource().GetAddress().GetSocketAddress(); sa.GetAddress() != "" {
		in.RemoteAddr = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	budget, detail := st.id.IdentifyInput(&in, &r)
	if detail != "" {
		return s.refuse(st, st.chain.Refuse(&r, sluice.Decision{Reason: sluice.ReasonInvalid}), &r, detail, rid, ridOK, grpcReq), nil
	}
	if r.Tenant == "" && st.cfg.SourceTenant {
		r.Tenant = attrs.GetSource().GetAddress().GetSocketAddress().GetAddress()
	}
	if budget > 0 {
		r.Deadline = st.chain.Clock().Now().Add(budget)
	}
	d, tk := st.chain.Decide(ctx, &r)
	if !d.Admitted {
		return s.refuse(st, d, &r, "", rid, ridOK, grpcReq), nil
	}
	tk.Done(sluice.OutcomeCancelled) // the end of the request cannot be seen (package documentation)
	return st.allow(&d, r.Class), nil
}

// header returns the headers identification reads from the attributes: the
// headers map (names in lower case), or the raw header list when Envoy
// sends that instead (encode_raw_headers); the request id falls back to
// the attributes' id.
func (st *state) header(hr *authv3.AttributeContext_HttpRequest) http.Header {
	h := make(http.Header, len(st.keys))
	if m := hr.GetHeaders(); len(m) > 0 {
		for _, k := range st.keys {
			if v, ok := m[k.lower]; ok {
				if k.joined && strings.Contains(v, ",") {
					h[k.canon] = strings.Split(v, ",")
				} else {
					h[k.canon] = []string{v}
				}
			}
		}
	} else {
		for _, hv := range hr.GetHeaderMap().GetHeaders() {
			for _, k := range st.keys {
				if strings.EqualFold(hv.GetKey(), k.lower) {
					v := hv.GetValue()
					if v == "" {
						v = string(hv.GetRawValue())
					}
					h[k.canon] = append(h[k.canon], v)
				}
			}
		}
	}
	ridKey := st.id.RequestIDHeader()
	if _, ok := h[ridKey]; !ok && hr.GetId() != "" {
		h[ridKey] = []string{hr.GetId()}
	}
	return h
}

// requestPath returns the path of a request target (origin or absolute
// form) without its query, percent-decoded once; ok is false for a target
// that does not parse.
func requestPath(target string) (string, bool) {
	if target == "" {
		return "", true
	}
	if target[0] == '/' && !strings.ContainsAny(target, "%#") {
		p, _, _ := strings.Cut(target, "?")
		return p, true
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return "", false
	}
	return u.Path, true
}

func header(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// allow returns the OK answer: the RateLimit fields (and a level that is
// not normal) on the response; the class the request was admitted as and
// the level on the forwarded request, replacing the client's own.
func (st *state) allow(d *sluice.Decision, class string) *authv3.CheckResponse {
	ok := &authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{header(sluice.ClassHeader, class)}}
	if !st.cfg.NoRateLimitHeaders && !st.cfg.HideCapacity {
		if st.policy != "" {
			ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd, header(hRateLimitPolicy, st.policy))
		}
		if wire.HasRateLimit(d) {
			ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd,
				header(hRateLimit, string(wire.AppendRateLimit(nil, d.Gate, d.Remaining, wire.Seconds(d.ResetAfter)))))
			if st.cfg.LegacyHeaders {
				ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd,
					header(hLegacyLimit, strconv.FormatInt(d.Limit, 10)),
					header(hLegacyRemaining, strconv.FormatInt(d.Remaining, 10)),
					header(hLegacyReset, strconv.FormatInt(wire.Seconds(d.ResetAfter), 10)))
			}
		}
	}
	if d.Level != sluice.LevelNormal {
		ok.Headers = append(ok.Headers, header(LevelHeader, d.Level.String()))
		ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd, header(LevelHeader, d.Level.String()))
	} else {
		ok.HeadersToRemove = []string{strings.ToLower(LevelHeader)}
	}
	return &authv3.CheckResponse{
		Status:       &rpcstatus.Status{},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok},
	}
}

// refuse returns the denial httpgate would have answered; for a gRPC
// request (content-type application/grpc), with grpcgate's pushback too.
func (s *Server) refuse(st *state, d sluice.Decision, r *sluice.Request, detail, rid string, ridOK, grpcReq bool) *authv3.CheckResponse {
	cfg := &st.cfg
	retry := int64(0)
	if d.Retryable {
		retry = wire.RetryAfter(d.RetryAfter, st.jitter, rand.Uint64())
	}
	hs := make([]*corev3.HeaderValueOption, 0, 10)
	if retry > 0 {
		hs = append(hs, header(hRetryAfter, strconv.FormatInt(retry, 10)))
	}
	if !cfg.NoRateLimitHeaders && !cfg.HideCapacity && wire.HasRateLimit(&d) {
		if st.policy != "" {
			hs = append(hs, header(hRateLimitPolicy, st.policy))
		}
		t := retry
		if t == 0 {
			t = wire.Seconds(d.ResetAfter)
		}
		hs = append(hs, header(hRateLimit, string(wire.AppendRateLimit(nil, d.Gate, d.Remaining, t))))
		if cfg.LegacyHeaders { // as on an admitted answer, with the reset RateLimit gives
			hs = append(hs, header(hLegacyLimit, strconv.FormatInt(d.Limit, 10)),
				header(hLegacyRemaining, strconv.FormatInt(d.Remaining, 10)),
				header(hLegacyReset, strconv.FormatInt(t, 10)))
		}
	}
	if grpcReq {
		if ms, ok := grpcgate.Pushback(&d, st.jitter, rand.Uint64()); ok {
			hs = append(hs, header(grpcgate.PushbackKey, strconv.FormatInt(ms, 10)))
		}
	}
	if !ridOK {
		rid = s.idPrefix + strconv.FormatUint(s.ids.Add(1), 16)
	}
	msg := string(wire.AppendMessage(nil, &d, r.Cost, retry, cfg.HideCapacity, detail))
	env := &wire.Envelope{
		Reason: d.Reason, Scope: d.Scope, Gate: d.Gate, Retryable: d.Retryable,
		EffectPossible: d.EffectPossible, RetryAfter: retry, RequestID: rid, Message: msg,
	}
	var body []byte
	ct := "application/json"
	if cfg.ProblemDetails {
		body, ct = wire.AppendProblem(nil, env, wire.Status(&d)), "application/problem+json"
	} else {
		body = wire.AppendEnvelope(nil, env)
	}
	hs = append(hs, header(st.id.RequestIDHeader(), rid),
		header("Content-Type", ct),
		header("Cache-Control", "no-store"))
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(grpcgate.Code(&d)), Message: msg},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(wire.Status(&d))},
			Headers: hs,
			Body:    string(body),
		}},
	}
}
