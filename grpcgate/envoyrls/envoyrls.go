// Package envoyrls serves Envoy's rate limit service protocol over gRPC
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from an
// rls.Service: it only translates the protos of
// github.com/envoyproxy/go-control-plane/envoy to and from the plain types
// of package github.com/sluice-go/sluice/grpcgate/rls, where the semantics live.
//
//	srv, _ := envoyrls.New(service, envoyrls.Options{})
//	gs := grpc.NewServer(srv.ServerOptions()...)
//	envoyrls.Register(gs, srv)
//	gs.Serve(lis)
//
// Field meanings follow envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto in
// github.com/envoyproxy/envoy (api/). Enumerations are translated by name,
// never by number: the request's envoy.type.v3.RateLimitUnit has no WEEK,
// the response's RateLimitResponse.RateLimit.Unit numbers WEEK 7 after
// YEAR 6.
package envoyrls

import (
	"context"
	"errors"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-go/sluice/grpcgate/rls"
)

// DefaultMaxRequestBytes is the default bound on an encoded request: 1
// MiB, far above what Envoy sends (a few descriptors of a few entries) and
// a quarter of gRPC's default 4 MiB.
const DefaultMaxRequestBytes = 1 << 20

// Options configure a Server. The zero value is valid.
type Options struct {
	// MaxRequestBytes bounds the encoded size of a request, in bytes.
	// ServerOptions hands it to grpc.NewServer as MaxRecvMsgSize, so that
	// larger messages are refused before they are read; the handler checks
	// it again for servers built without them, refusing larger requests
	// with RESOURCE_EXHAUSTED (gRPC's own code for a message too large)
	// before translating them. Default DefaultMaxRequestBytes; negative:
	// no bound of the handler's own.
	MaxRequestBytes int
}

// Server is a RateLimitServiceServer over an rls.Service. It is safe for
// concurrent use when the service is.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer
	svc rls.Service
	max int
}

// New returns a server answering with svc. It returns an error for a nil
// service.
func New(svc rls.Service, opts Options) (*Server, error) {
	if svc == nil {
		return nil, errors.New("envoyrls: nil service")
	}
	if opts.MaxRequestBytes == 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	return &Server{svc: svc, max: opts.MaxRequestBytes}, nil
}

// Register registers srv on g as envoy.service.ratelimit.v3.RateLimitService.
func Register(g grpc.ServiceRegistrar, srv *Server) { rlspb.RegisterRateLimitServiceServer(g, srv) }

// ServerOptions returns the options a grpc.Server dedicated to this
// service should be built with: the request size bound as MaxRecvMsgSize.
func (s *Server) ServerOptions() []grpc.ServerOption {
	if s.max <= 0 {
		return nil
	}
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(s.max)}
}

// ShouldRateLimit translates req, asks the service and translates its
// answer. Errors are gRPC statuses: a request over MaxRequestBytes is
// RESOURCE_EXHAUSTED; rls.ErrInvalid (and a request the translation
// refuses: an unknown unit, a unit_multiplier other than 1) is
// INVALID_ARGUMENT; rls.ErrUnavailable is UNAVAILABLE; a context error
// keeps its code; a status error of the service passes through; anything
// else, and an answer whose statuses do not match the descriptors one for
// one, is INTERNAL. Envoy's filter fails open on any error unless its
// failure_mode_deny is set. A nil request, or nil messages inside it, are
// read as empty.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if s.max > 0 {
		if n := proto.Size(req); n > s.max {
			return nil, status.Errorf(codes.ResourceExhausted, "envoyrls: request of %d bytes, at most %d accepted", n, s.max)
		}
	}
	r, err := DecodeRequest(req)
	if err != nil {
		return nil, grpcError(err)
	}
	resp, err := s.svc.ShouldRateLimit(ctx, r)
	if err != nil {
		return nil, grpcError(err)
	}
	if resp == nil {
		return nil, status.Error(codes.Internal, "envoyrls: the service gave no response")
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		return nil, status.Errorf(codes.Internal, "envoyrls: the service gave %d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
	}
	return EncodeResponse(resp), nil
}

// grpcError maps a service or translation error to a gRPC status error.
func grpcError(err error) error {
	switch {
	case errors.Is(err, rls.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, rls.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// DecodeRequest translates a request proto into an rls.Request. Nil
// messages read as empty; the result is for the service to validate.
// It refuses, with an error wrapping rls.ErrInvalid, what an rls.Request
// cannot say: a limit override's unit that envoy.type.v3.RateLimitUnit does
// not name, and a unit_multiplier other than 1.
func DecodeRequest(m *rlspb.RateLimitRequest) (*rls.Request, error) {
	r := &rls.Request{Domain: m.GetDomain(), Hits: m.GetHitsAddend()}
	ds := m.GetDescriptors()
	if len(ds) == 0 {
		return r, nil
	}
	// One allocation each for the descriptors, their entries, their
	// overrides and their hits.
	var nEntries, nLimits, nHits int
	for _, d := range ds {
		nEntries += len(d.GetEntries())
		if d.GetLimit() != nil {
			nLimits++
		}
		if d.GetHitsAddend() != nil {
			nHits++
		}
	}
	r.Descriptors = make([]rls.Descriptor, len(ds))
	entries := make([]rls.Entry, nEntries)
	limits := make([]rls.Override, nLimits)
	hits := make([]uint64, nHits)
	for i, d := range ds {
		rd := &r.Descriptors[i]
		es := d.GetEntries()
		rd.Entries, entries = entries[:len(es):len(es)], entries[len(es):]
		for j, e := range es {
			rd.Entries[j] = rls.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if l := d.GetLimit(); l != nil {
			u, ok := requestUnit(l.GetUnit())
			if !ok {
				return nil, fmt.Errorf("%w: descriptor %d: limit unit %d is not a RateLimitUnit", rls.ErrInvalid, i, int32(l.GetUnit()))
			}
			if mu := l.GetUnitMultiplier(); mu != nil && mu.GetValue() != 1 {
				return nil, fmt.Errorf("%w: descriptor %d: limit unit_multiplier %d not supported (only 1)", rls.ErrInvalid, i, mu.GetValue())
			}
			limits[0] = rls.Override{RequestsPerUnit: l.GetRequestsPerUnit(), Unit: u}
			rd.Limit, limits = &limits[0], limits[1:]
		}
		if h := d.GetHitsAddend(); h != nil {
			hits[0] = h.GetValue()
			rd.Hits, hits = &hits[0], hits[1:]
		}
		rd.Negative = d.GetIsNegativeHits()
	}
	return r, nil
}

// requestUnit translates envoy.type.v3.RateLimitUnit by name.
func requestUnit(u typev3.RateLimitUnit) (rls.Unit, bool) {
	switch u {
	case typev3.RateLimitUnit_UNKNOWN:
		return rls.UnitUnknown, true
	case typev3.RateLimitUnit_SECOND:
		return rls.Second, true
	case typev3.RateLimitUnit_MINUTE:
		return rls.Minute, true
	case typev3.RateLimitUnit_HOUR:
		return rls.Hour, true
	case typev3.RateLimitUnit_DAY:
		return rls.Day, true
	case typev3.RateLimitUnit_MONTH:
		return rls.Month, true
	case typev3.RateLimitUnit_YEAR:
		return rls.Year, true
	}
	return 0, false
}

// responseUnit translates a unit to RateLimitResponse.RateLimit.Unit by
// name; a unit it does not know is UNKNOWN.
func responseUnit(u rls.Unit) rlspb.RateLimitResponse_RateLimit_Unit {
	switch u {
	case rls.Second:
		return rlspb.RateLimitResponse_RateLimit_SECOND
	case rls.Minute:
		return rlspb.RateLimitResponse_RateLimit_MINUTE
	case rls.Hour:
		return rlspb.RateLimitResponse_RateLimit_HOUR
	case rls.Day:
		return rlspb.RateLimitResponse_RateLimit_DAY
	case rls.Week:
		return rlspb.RateLimitResponse_RateLimit_WEEK
	case rls.Month:
		return rlspb.RateLimitResponse_RateLimit_MONTH
	case rls.Year:
		return rlspb.RateLimitResponse_RateLimit_YEAR
	}
	return rlspb.RateLimitResponse_RateLimit_UNKNOWN
}

// responseCode translates a verdict by name; one it does not know is
// UNKNOWN.
func responseCode(c rls.Code) rlspb.RateLimitResponse_Code {
	switch c {
	case rls.CodeOK:
		return rlspb.RateLimitResponse_OK
	case rls.CodeOverLimit:
		return rlspb.RateLimitResponse_OVER_LIMIT
	}
	return rlspb.RateLimitResponse_UNKNOWN
}

// EncodeResponse translates an rls.Response into its proto: the overall
// code, one DescriptorStatus per status in order (current_limit only when
// a limit applied, duration_until_reset when a limit applied or a reset
// is due), and the headers as response_headers_to_add. The quota fields,
// hidden and not implemented in the API, stay unset.
func EncodeResponse(r *rls.Response) *rlspb.RateLimitResponse {
	out := &rlspb.RateLimitResponse{OverallCode: responseCode(r.Overall)}
	if n := len(r.Statuses); n > 0 {
		var nLimits, nResets int
		for i := range r.Statuses {
			if r.Statuses[i].Limit != nil {
				nLimits++
			}
			if r.Statuses[i].Limit != nil || r.Statuses[i].ResetIn > 0 {
				nResets++
			}
		}
		sts := make([]rlspb.RateLimitResponse_DescriptorStatus, n)
		limits := make([]rlspb.RateLimitResponse_RateLimit, nLimits)
		resets := make([]durationpb.Duration, nResets)
		out.Statuses = make([]*rlspb.RateLimitResponse_DescriptorStatus, n)
		for i := range r.Statuses {
			s := &r.Statuses[i]
			ps := &sts[i]
			ps.Code = responseCode(s.Code)
			ps.LimitRemaining = s.Remaining
			if l := s.Limit; l != nil {
				pl := &limits[0]
				limits = limits[1:]
				pl.Name, pl.RequestsPerUnit, pl.Unit = l.Name, l.RequestsPerUnit, responseUnit(l.Unit)
				ps.CurrentLimit = pl
			}
			if s.Limit != nil || s.ResetIn > 0 {
				d := &resets[0]
				resets = resets[1:]
				reset := max(s.ResetIn, 0)
				d.Seconds, d.Nanos = int64(reset/1e9), int32(reset%1e9)
				ps.DurationUntilReset = d
			}
			out.Statuses[i] = ps
		}
	}
	if len(r.Headers) > 0 {
		hs := make([]corev3.HeaderValue, len(r.Headers))
		out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, len(r.Headers))
		for i, h := range r.Headers {
			hs[i].Key, hs[i].Value = h.Name, h.Value
			out.ResponseHeadersToAdd[i] = &hs[i]
		}
	}
	return out
}
