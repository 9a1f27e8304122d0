package rlsserve

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// The bounds of sluice serve's gRPC servers (the rate limit service and
// ext_authz): what a caller can hold of them, and what happens at the
// bound.
const (
	// MaxStreamsPerConn is the most calls one connection runs at once
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); its client queues the rest.
	MaxStreamsPerConn = 256
	// MaxCalls is the most calls the server runs at once, every
	// connection together: one past it is refused at once with
	// RESOURCE_EXHAUSTED, before a goroutine or a buffer is spent on it.
	MaxCalls = 4096
	// CallTimeout bounds a call that came without a shorter deadline: a
	// rate limit check or an authorization check takes milliseconds, and a
	// call whose message never comes (a stalled client) gives its slot
	// back after this long (DEADLINE_EXCEEDED).
	CallTimeout = 10 * time.Second
)

// callGuard counts a server's calls in progress (callGuard.tap runs as a
// stream is created; the count drops when the stream's context ends, as
// every stream's does when it is done).
type callGuard struct {
	max     int64
	timeout time.Duration
	calls   atomic.Int64
}

// tap admits a new call while fewer than max run, under a deadline of at
// most timeout.
func (g *callGuard) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	if g.calls.Add(1) > g.max {
		g.calls.Add(-1)
		return nil, status.Errorf(codes.ResourceExhausted, "sluice serve: %d calls in progress, the server's bound; retry", g.max)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout) // a shorter deadline of the call's own stands
	context.AfterFunc(ctx, func() {
		g.calls.Add(-1)
		cancel()
	})
	return ctx, nil
}

// guardOptions are the gRPC server options of the bounds: the stream
// limits, and keepalive enforcement (a client may ping at most every 10 s,
// also without a call in progress; one that pings more often is
// disconnected, as gRPC's default policy would do at 5 minutes).
func guardOptions(g *callGuard) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		grpc.InTapHandle(g.tap),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}
