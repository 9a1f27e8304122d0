// This file holds the protocol's shapes in plain Go, independent of the
// generated protobuf code, so that the semantics live and are tested here
// and the gRPC and JSON adapters only translate. Field meanings follow
// envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto.

package rls

import (
	"context"
	"errors"
	"time"
)

// Unit is a rate limit's time unit, numbered as envoy.type.v3.RateLimitUnit
// (requests) and RateLimitResponse.RateLimit.Unit (responses; only the
// latter has Week).
type Unit uint8

const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5 // 30 days, as envoyproxy/ratelimit counts it
	Year        Unit = 6 // 365 days
	Week        Unit = 7 // responses only
)

// Entry is one key/value step of a descriptor's hierarchical path.
type Entry struct {
	Key   string
	Value string
}

// Override is a descriptor's own limit, replacing the configured one
// (RateLimitDescriptor.limit).
type Override struct {
	RequestsPerUnit uint32
	Unit            Unit
}

// Descriptor is one descriptor of a request: the entries, an optional
// limit override and an optional hit count of its own.
type Descriptor struct {
	Entries []Entry
	// Limit, when set, replaces the configured limit for this descriptor.
	Limit *Override
	// Hits, when set, replaces the request's Hits for this descriptor; 0
	// checks without consuming (RateLimitDescriptor.hits_addend).
	Hits *uint64
	// Negative makes Hits a refund: the units are given back
	// (RateLimitDescriptor.is_negative_hits).
	Negative bool
}

// Request is a ShouldRateLimit call.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hits is the units each descriptor consumes; 0 means 1
	// (RateLimitRequest.hits_addend).
	Hits uint32
}

// Code is a verdict, numbered as RateLimitResponse.Code.
type Code uint8

const (
	CodeUnknown   Code = 0
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

// Limit is the limit that applied to a descriptor
// (RateLimitResponse.RateLimit).
type Limit struct {
	Name            string
	RequestsPerUnit uint32
	Unit            Unit
}

// Status is the verdict for one descriptor
// (RateLimitResponse.DescriptorStatus).
type Status struct {
	Code Code
	// Limit is the limit that applied; nil when no rule matched.
	Limit *Limit
	// Remaining is what is left in the current window after this call.
	Remaining uint32
	// ResetIn is the time until the window ends (or, for sluice's bucket
	// gates, until the bucket is full again).
	ResetIn time.Duration
}

// Header is one response header to add downstream.
type Header struct {
	Name  string
	Value string
}

// Response is the answer to a Request: the overall verdict and one
// status per descriptor, in the request's order.
type Response struct {
	Overall  Code
	Statuses []Status
	// Headers are the response headers to add (the RateLimit fields of
	// the most constrained descriptor), when enabled.
	Headers []Header
}

// Service answers ShouldRateLimit calls. Implementations are safe for
// concurrent use.
type Service interface {
	ShouldRateLimit(ctx context.Context, r *Request) (*Response, error)
}

// ErrInvalid marks a malformed request (no domain, no descriptors, too
// many, an empty key, hits out of range); adapters answer it as gRPC
// INVALID_ARGUMENT or HTTP 400. Errors wrap it with the reason.
var ErrInvalid = errors.New("rls: invalid request")

// ErrUnavailable marks a call the service could not answer because its
// store is unreachable and the failure policy is to refuse; adapters
// answer it as gRPC UNAVAILABLE or HTTP 503.
var ErrUnavailable = errors.New("rls: store unavailable")
