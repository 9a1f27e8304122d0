package grpcgate_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/grpcgate"
	"github.com/sluice-go/sluice/identify"
)

// details returns a status error's ErrorInfo and RetryInfo (nil when
// absent).
func details(t *testing.T, err error) (*errdetails.ErrorInfo, *errdetails.RetryInfo) {
	t.Helper()
	var ei *errdetails.ErrorInfo
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			ei = v
		case *errdetails.RetryInfo:
			ri = v
		}
	}
	if ei == nil {
		t.Fatalf("no ErrorInfo in %v", err)
	}
	return ei, ri
}

// The service-wide pool is not advertised: it is shared by every caller.
const wantPolicy = `"request-rate";q=100;w=1;sluice-burst=5, "tenant-inflight";q=2;qu="concurrent-requests"`

func TestAdmitted(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	r := f.call(t, "Unary", "x-api-key", "acme")
	must(t, r.err)
	if got := one(t, r.trailer, "ratelimit-policy"); got != wantPolicy {
		t.Errorf("ratelimit-policy %q", got)
	}
	// The tightest limit is the tenant's concurrency (1 of 2 left).
	if got := one(t, r.trailer, "ratelimit"); got != `"tenant-inflight";r=1` {
		t.Errorf("ratelimit %q", got)
	}
	if len(r.header.Get("ratelimit")) != 0 || len(r.trailer.Get(grpcgate.PushbackKey)) != 0 {
		t.Errorf("header %v trailer %v", r.header, r.trailer)
	}
	req, n := f.probe.seen()
	if n != 1 || req.Tenant != "acme" || req.Class != sluice.ClassSheddable || req.Operation != "/"+service+"/*" || req.Cost != 1 {
		t.Fatalf("probe saw %+v (%d decisions)", req, n)
	}
	if o := f.probe.nextRelease(t); o != sluice.OutcomeUseful {
		t.Fatalf("released %v", o)
	}
}

// Token bucket 100/s, burst 5: the 6th call of a tenant is refused with
// RESOURCE_EXHAUSTED and a pushback of exactly the 10 ms the next token
// takes (no jitter), and the RateLimit fields in the trailer.
func TestEntitlementIsResourceExhaustedWithPushback(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	for i := range 5 {
		if r := f.call(t, "Unary", "x-api-key", "acme"); r.err != nil {
			t.Fatalf("call %d: %v", i+1, r.err)
		}
	}
	r := f.call(t, "Unary", "x-api-key", "acme", "x-request-id", "req-42")
	if r.code() != codes.ResourceExhausted {
		t.Fatalf("6th call: %v", r.err)
	}
	if got := one(t, r.trailer, grpcgate.PushbackKey); got != "10" {
		t.Errorf("pushback %q", got)
	}
	if got := one(t, r.trailer, "ratelimit"); got != `"request-rate";r=0;t=1` {
		t.Errorf("ratelimit %q", got)
	}
	if got := one(t, r.trailer, "ratelimit-policy"); got != wantPolicy {
		t.Errorf("ratelimit-policy %q", got)
	}
	if got := one(t, r.trailer, "x-request-id"); got != "req-42" {
		t.Errorf("request id %q", got)
	}
	if len(r.header) != 0 {
		t.Errorf("a refusal sent header metadata %v: not Trailers-Only", r.header)
	}
	msg := status.Convert(r.err).Message()
	if !strings.Contains(msg, "request-rate: rate limit exceeded (100 requests per second per tenant, in bursts of up to 5)") || !strings.Contains(msg, "retry after 1s") {
		t.Errorf("message %q", msg)
	}
	ei, ri := details(t, r.err)
	if ei.Reason != "POLICY_RATE" || ei.Domain != grpcgate.ErrorDomain || ei.Metadata["gate"] != "request-rate" || ei.Metadata["scope"] != "tenant" || ei.Metadata["retryable"] != "true" {
		t.Errorf("ErrorInfo %v", ei)
	}
	if ri == nil || ri.RetryDelay.AsDuration() != 10*time.Millisecond {
		t.Errorf("RetryInfo %v", ri)
	}
	// Another tenant has its own bucket; 10 ms later acme has a token.
	if r := f.call(t, "Unary", "x-api-key", "other"); r.err != nil {
		t.Fatal(r.err)
	}
	f.clk.Advance(10 * time.Millisecond)
	if r := f.call(t, "Unary", "x-api-key", "acme"); r.err != nil {
		t.Fatal(r.err)
	}
}

// retryConfig retries RESOURCE_EXHAUSTED and UNAVAILABLE up to twice more
// with a backoff far longer than the calls' deadline: a retry that comes
// in time came at the server's pushback.
const retryConfig = `{"methodConfig":[{"name":[{"service":"sluice.test.Echo"}],"retryPolicy":{
	"maxAttempts":3,"initialBackoff":"300s","maxBackoff":"300s","backoffMultiplier":1,
	"retryableStatusCodes":["RESOURCE_EXHAUSTED","UNAVAILABLE"]}}]}`

// A grpc-go client with a retry policy retries a refusal after the
// pushback: the tenant's 6th call is refused, its retry comes after 10 ms
// (the fake clock is moved by then) and is admitted.
func TestPushbackDrivesClientRetry(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules}, grpc.WithDefaultServiceConfig(retryConfig))
	for range 5 {
		must(t, f.call(t, "Unary", "x-api-key", "acme").err)
	}
	f.setOnCall(func(n int64) {
		if n == 7 { // the 6th call's retry
			f.clk.Advance(10 * time.Millisecond)
		}
	})
	if r := f.call(t, "Unary", "x-api-key", "acme"); r.err != nil {
		t.Fatalf("retried call: %v", r.err)
	}
	if a, rt := f.attempts.Load(), f.retries.Load(); a != 7 || rt != 1 {
		t.Fatalf("%d attempts, %d retries; want 7 and 1", a, rt)
	}
}

// A refusal retrying cannot help (a cost above the burst) says "do not
// retry" (-1): the client does not retry though its policy lists the code.
func TestNotRetryableSaysDoNotRetry(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules}, grpc.WithDefaultServiceConfig(retryConfig))
	r := f.call(t, "Critical", "x-api-key", "acme", "x-items", "500") // cost 50 > burst 5
	if r.code() != codes.ResourceExhausted {
		t.Fatal(r.err)
	}
	if got := one(t, r.trailer, grpcgate.PushbackKey); got != "-1" {
		t.Errorf("pushback %q", got)
	}
	if a := f.attempts.Load(); a != 1 {
		t.Fatalf("%d attempts", a)
	}
	msg := status.Convert(r.err).Message()
	if !strings.Contains(msg, "cost of 50 exceeds") || !strings.Contains(msg, "retrying cannot help") {
		t.Errorf("message %q", msg)
	}
	ei, ri := details(t, r.err)
	if ei.Metadata["retryable"] != "false" || ri != nil {
		t.Errorf("details %v %v", ei, ri)
	}
}

// blocker makes the echo handler of Unary hold calls whose message is
// "block" until released.
type blocker struct {
	started chan struct{}
	release chan struct{}
}

func (f *fixture) blockUnary() *blocker {
	b := &blocker{started: make(chan struct{}, 16), release: make(chan struct{})}
	f.setUnary(func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if in.Value == "block" {
			b.started <- struct{}{}
			<-b.release
		}
		return in, nil
	})
	return b
}

// hold starts n calls that block in the handler and waits until they do;
// the returned function releases them and returns their errors.
func (f *fixture) hold(t *testing.T, b *blocker, n int, kv ...string) func() []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, kv...)
			errs[i] = f.conn.Invoke(ctx, "/"+service+"/Unary", wrapperspb.String("block"), new(wrapperspb.StringValue))
		})
	}
	for range n {
		select {
		case <-b.started:
		case <-time.After(20 * time.Second):
			t.Fatal("blocked calls did not start")
		}
	}
	return func() []error { close(b.release); wg.Wait(); return errs }
}

// A tenant's own concurrency limit is an entitlement: RESOURCE_EXHAUSTED,
// with the gate's retry hint (1 s by default) as pushback.
func TestTenantConcurrencyIsResourceExhausted(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	b := f.blockUnary()
	done := f.hold(t, b, 2, "x-api-key", "acme")
	r := f.call(t, "Unary", "x-api-key", "acme")
	if r.code() != codes.ResourceExhausted || one(t, r.trailer, grpcgate.PushbackKey) != "1000" {
		t.Fatalf("%v, trailer %v", r.err, r.trailer)
	}
	if ei, _ := details(t, r.err); ei.Reason != "CONCURRENCY" || ei.Metadata["scope"] != "tenant" {
		t.Errorf("ErrorInfo %v", ei)
	}
	must(t, f.call(t, "Unary", "x-api-key", "other").err)
	for _, err := range done() {
		must(t, err)
	}
}

// The service-wide pool protects capacity: UNAVAILABLE, pushback of its
// 2 s retry hint; the slot is back once the holder's handler returns.
func TestOverloadIsUnavailable(t *testing.T) {
	f := newFixture(t, 1, grpcgate.Options{Rules: testRules})
	b := f.blockUnary()
	done := f.hold(t, b, 1, "x-api-key", "acme")
	r := f.call(t, "Unary", "x-api-key", "other")
	if r.code() != codes.Unavailable {
		t.Fatal(r.err)
	}
	if got := one(t, r.trailer, grpcgate.PushbackKey); got != "2000" {
		t.Errorf("pushback %q", got)
	}
	if got := r.trailer.Get("ratelimit"); len(got) != 0 {
		t.Errorf("ratelimit %q for a quota shared by every caller", got)
	}
	ei, ri := details(t, r.err)
	if ei.Reason != "CONCURRENCY" || ei.Metadata["scope"] != "service" || ei.Metadata["gate"] != "pool" || ri.RetryDelay.AsDuration() != 2*time.Second {
		t.Errorf("details %v %v", ei, ri)
	}
	if msg := status.Convert(r.err).Message(); !strings.Contains(msg, "pool: too many requests in flight (1 per service); retry after 2s") {
		t.Errorf("message %q", msg)
	}
	for _, err := range done() {
		must(t, err)
	}
	if o := f.probe.nextRelease(t); o != sluice.OutcomeUseful {
		t.Fatalf("released %v", o)
	}
	must(t, f.call(t, "Unary", "x-api-key", "other").err)
}

// The call's gRPC deadline becomes the request's deadline on the chain's
// clock; MaxDeadline caps it (and the handler's context), DefaultDeadline
// gives calls without one a deadline.
func TestDeadlinePropagation(t *testing.T) {
	var mu sync.Mutex
	var left time.Duration
	record := func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		dl, ok := ctx.Deadline()
		mu.Lock()
		defer mu.Unlock()
		left = -1
		if ok {
			left = time.Until(dl)
		}
		return in, nil
	}
	got := func() time.Duration { mu.Lock(); defer mu.Unlock(); return left }

	t.Run("call deadline", func(t *testing.T) {
		f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
		f.setUnary(record)
		must(t, f.call(t, "Unary").err) // 20 s
		req, _ := f.probe.seen()
		if d := req.Deadline.Sub(f.clk.Now()); d <= 0 || d > 20*time.Second {
			t.Fatalf("request deadline in %v", d)
		}
		if l := got(); l <= 0 || l > 20*time.Second {
			t.Fatalf("handler deadline in %v", l)
		}
	})
	t.Run("capped", func(t *testing.T) {
		rules := testRules
		rules.MaxDeadline = 5 * time.Second
		f := newFixture(t, 10, grpcgate.Options{Rules: rules})
		f.setUnary(record)
		must(t, f.call(t, "Unary").err)
		req, _ := f.probe.seen()
		if d := req.Deadline.Sub(f.clk.Now()); d != 5*time.Second {
			t.Fatalf("request deadline in %v, want the cap", d)
		}
		if l := got(); l <= 0 || l > 5*time.Second {
			t.Fatalf("handler deadline in %v", l)
		}
	})
	t.Run("default", func(t *testing.T) {
		rules := testRules
		rules.DefaultDeadline = 3 * time.Second
		f := newFixture(t, 10, grpcgate.Options{Rules: rules})
		f.setUnary(record)
		must(t, f.callCtx(context.Background(), "Unary").err)
		req, _ := f.probe.seen()
		if d := req.Deadline.Sub(f.clk.Now()); d != 3*time.Second {
			t.Fatalf("request deadline in %v, want the default", d)
		}
		if l := got(); l <= 0 || l > 3*time.Second {
			t.Fatalf("handler deadline in %v", l)
		}
	})
	t.Run("none", func(t *testing.T) {
		f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
		f.setUnary(record)
		must(t, f.callCtx(context.Background(), "Unary").err)
		if req, _ := f.probe.seen(); req.Deadline != 0 || got() != -1 {
			t.Fatalf("deadline %v, handler %v", req.Deadline, got())
		}
	})
}

// A call whose deadline has passed by the time it is decided is refused
// with reason deadline: UNAVAILABLE, as httpgate's 503.
func TestExpiredDeadlineIsUnavailable(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := f.ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/" + service + "/Unary"}, func(context.Context, any) (any, error) {
		t.Fatal("handler ran")
		return nil, nil
	})
	if status.Code(err) != codes.Unavailable {
		t.Fatal(err)
	}
	if ei, _ := details(t, err); ei.Reason != "DEADLINE" {
		t.Fatalf("ErrorInfo %v", ei)
	}
}

// Class, operation and cost come from the method rules, never from the
// caller.
func TestClassFromMethodRules(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	must(t, f.call(t, "Critical", "x-api-key", "a", "x-items", "25", "x-class", "sandbox").err)
	req, _ := f.probe.seen()
	if req.Class != sluice.ClassCritical || req.Operation != "POST /"+service+"/Critical" || req.Cost != 3 {
		t.Fatalf("critical: %+v", req)
	}
	must(t, f.call(t, "Other", "x-api-key", "b", "x-items", "25").err)
	req, _ = f.probe.seen()
	if req.Class != sluice.ClassSheddable || req.Operation != "/"+service+"/*" || req.Cost != 1 {
		t.Fatalf("other: %+v", req)
	}

	// Without a matching route: the default class and operation "other".
	f2 := newFixture(t, 10, grpcgate.Options{Rules: identify.Rules{PathMatch: identify.PathExact, Routes: []identify.Route{{Path: "/elsewhere.Svc/M", Class: sluice.ClassCritical}}}})
	must(t, f2.call(t, "Unary").err)
	if req, _ := f2.probe.seen(); req.Class != sluice.ClassDefault || req.Operation != "other" {
		t.Fatalf("unmatched: %+v", req)
	}
}

// Malformed identity or cost metadata is INVALID_ARGUMENT, decided before
// any gate, with no pushback and a request id.
func TestMalformedMetadataIsInvalidArgument(t *testing.T) {
	rules := testRules
	rules.RequireTenant = true
	f := newFixture(t, 10, grpcgate.Options{Rules: rules}, grpc.WithDefaultServiceConfig(retryConfig))
	for _, tc := range []struct {
		name, method string
		kv           []string
		detail       string
	}{
		{"two tenants", "Unary", []string{"x-api-key", "a", "x-api-key", "b"}, "more than one X-Api-Key header"},
		{"bad tenant", "Unary", []string{"x-api-key", "a b"}, "malformed X-Api-Key header"},
		{"no tenant", "Unary", nil, "missing X-Api-Key header"},
		{"bad cost", "Critical", []string{"x-api-key", "a", "x-items", "lots"}, "malformed X-Items header"},
		{"negative cost", "Critical", []string{"x-api-key", "a", "x-items", "-1"}, "malformed X-Items header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.attempts.Load()
			r := f.call(t, tc.method, tc.kv...)
			if r.code() != codes.InvalidArgument {
				t.Fatal(r.err)
			}
			if msg := status.Convert(r.err).Message(); !strings.Contains(msg, tc.detail) || !strings.Contains(msg, "fix the request") {
				t.Errorf("message %q", msg)
			}
			if vs := r.trailer.Get(grpcgate.PushbackKey); len(vs) != 0 {
				t.Errorf("pushback %q on an invalid request", vs)
			}
			if one(t, r.trailer, "x-request-id") == "" {
				t.Error("no request id")
			}
			if ei, ri := details(t, r.err); ei.Reason != "INVALID" || ri != nil {
				t.Errorf("details %v %v", ei, ri)
			}
			if a := f.attempts.Load() - before; a != 1 {
				t.Errorf("%d attempts", a)
			}
		})
	}
	if _, n := f.probe.seen(); n != 0 {
		t.Fatalf("the gates decided %d invalid calls", n)
	}
}

func (f *fixture) stream(t *testing.T, kv ...string) grpc.ClientStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	cs, err := f.conn.NewStream(metadata.AppendToOutgoingContext(ctx, kv...), &streamDesc, "/"+service+"/Stream")
	must(t, err)
	return cs
}

func roundTrip(cs grpc.ClientStream) error {
	if err := cs.SendMsg(wrapperspb.String("ping")); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return cs.RecvMsg(new(wrapperspb.StringValue))
}

// A stream is admitted when it starts and holds its permits until its
// handler returns: with a pool of one, a second stream is refused while
// the first is open, and admitted once it has closed.
func TestStreamHoldsPermitForItsLife(t *testing.T) {
	f := newFixture(t, 1, grpcgate.Options{Rules: testRules})
	s1 := f.stream(t, "x-api-key", "a")
	must(t, roundTrip(s1))
	if req, _ := f.probe.seen(); req.Class != sluice.ClassSheddable || req.Tenant != "a" {
		t.Fatalf("stream identified as %+v", req)
	}
	must(t, roundTrip(s1)) // still open, still held
	if n := f.probe.inflight.Load(); n != 1 {
		t.Fatalf("%d in flight", n)
	}

	s2 := f.stream(t, "x-api-key", "b")
	err := roundTrip(s2)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("second stream: %v", err)
	}
	if got := one(t, s2.Trailer(), grpcgate.PushbackKey); got != "2000" {
		t.Errorf("stream pushback %q", got)
	}

	must(t, s1.CloseSend())
	if err := s1.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
		t.Fatalf("first stream end: %v", err)
	}
	if o := f.probe.nextRelease(t); o != sluice.OutcomeUseful {
		t.Fatalf("released %v", o)
	}
	s3 := f.stream(t, "x-api-key", "b")
	must(t, roundTrip(s3))
	must(t, s3.CloseSend())
	if err := s3.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	// The pool is full, but the trailer tells of the caller's own quota.
	if trailer := s3.Trailer(); one(t, trailer, "ratelimit") != `"tenant-inflight";r=1` {
		t.Errorf("stream trailer %v", trailer)
	}
}

// A panicking handler releases its permits (errored) and the panic goes on
// to the recovery interceptor outside: with a pool of one, every call
// after a panic is still admitted.
func TestPanicReleasesPermit(t *testing.T) {
	f := newFixture(t, 1, grpcgate.Options{Rules: testRules})
	f.setUnary(func(context.Context, string, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		panic("handler bug")
	})
	f.setStream(func(grpc.ServerStream) error { panic("stream bug") })
	for i := range 3 {
		f.clk.Advance(time.Second) // the tenant's bucket is full again
		if r := f.call(t, "Unary", "x-api-key", "a"); r.code() != codes.Internal {
			t.Fatalf("unary %d: %v", i, r.err)
		}
		if o := f.probe.nextRelease(t); o != sluice.OutcomeErrored {
			t.Fatalf("unary %d released %v", i, o)
		}
		if err := roundTrip(f.stream(t, "x-api-key", "a")); status.Code(err) != codes.Internal {
			t.Fatalf("stream %d: %v", i, err)
		}
		if o := f.probe.nextRelease(t); o != sluice.OutcomeErrored {
			t.Fatalf("stream %d released %v", i, o)
		}
	}
	if p := f.panics.Load(); p != 6 {
		t.Fatalf("%d panics reached the recovery interceptor", p)
	}
	if n := f.probe.inflight.Load(); n != 0 {
		t.Fatalf("%d in flight", n)
	}
}

// Called directly, the interceptor lets a handler's panic through after
// releasing.
func TestPanicGoesOn(t *testing.T) {
	f := newFixture(t, 1, grpcgate.Options{Rules: testRules})
	var got any
	func() {
		defer func() { got = recover() }()
		f.ic.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/" + service + "/Unary"}, func(context.Context, any) (any, error) {
			panic("boom")
		})
	}()
	if got != "boom" {
		t.Fatalf("recovered %v", got)
	}
	if o := f.probe.nextRelease(t); o != sluice.OutcomeErrored || f.probe.inflight.Load() != 0 {
		t.Fatalf("released %v", o)
	}
}

// The Ticket's outcome follows the handler's status.
func TestOutcomeFromHandlerStatus(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	errs := map[string]error{
		"ok":        nil,
		"notfound":  status.Error(codes.NotFound, "no such order"),
		"internal":  status.Error(codes.Internal, "bug"),
		"canceled":  status.Error(codes.Canceled, "gave up"),
		"deadline":  status.Error(codes.DeadlineExceeded, "too slow"),
		"ctxcancel": context.Canceled,
		"plain":     errors.New("plain"),
	}
	f.setUnary(func(_ context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if err := errs[in.Value]; err != nil {
			return nil, err
		}
		return in, nil
	})
	want := map[string]sluice.Outcome{
		"ok": sluice.OutcomeUseful, "notfound": sluice.OutcomeUseful, "internal": sluice.OutcomeErrored,
		"canceled": sluice.OutcomeCancelled, "deadline": sluice.OutcomeLate, "ctxcancel": sluice.OutcomeCancelled,
		"plain": sluice.OutcomeErrored,
	}
	for name, o := range want {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := f.conn.Invoke(metadata.AppendToOutgoingContext(ctx, "x-api-key", name), "/"+service+"/Unary", wrapperspb.String(name), new(wrapperspb.StringValue))
		cancel()
		if status.Code(err) != status.Code(errs[name]) && name != "ctxcancel" && name != "plain" {
			t.Errorf("%s: %v", name, err)
		}
		if got := f.probe.nextRelease(t); got != o {
			t.Errorf("%s: released %v, want %v", name, got, o)
		}
	}
}

// A client that cancels while its call runs: cancelled.
func TestClientCancelIsCancelled(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	started := make(chan struct{})
	f.setUnary(func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		close(started)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if r := f.callCtx(ctx, "Unary"); r.code() != codes.Canceled {
		t.Fatal(r.err)
	}
	if o := f.probe.nextRelease(t); o != sluice.OutcomeCancelled {
		t.Fatalf("released %v", o)
	}
}

func TestOutcome(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want sluice.Outcome
	}{
		{ctx, nil, sluice.OutcomeUseful},
		{cancelled, nil, sluice.OutcomeCancelled},
		{ctx, status.Error(codes.InvalidArgument, ""), sluice.OutcomeUseful},
		{ctx, status.Error(codes.ResourceExhausted, ""), sluice.OutcomeUseful},
		{ctx, status.Error(codes.Unavailable, ""), sluice.OutcomeErrored},
		{ctx, status.Error(codes.Unimplemented, ""), sluice.OutcomeErrored},
		{ctx, status.Error(codes.DataLoss, ""), sluice.OutcomeErrored},
		{ctx, status.Error(codes.Unknown, ""), sluice.OutcomeErrored},
		{ctx, status.Error(codes.DeadlineExceeded, ""), sluice.OutcomeLate},
		{ctx, context.DeadlineExceeded, sluice.OutcomeLate},
		{ctx, status.Error(codes.Canceled, ""), sluice.OutcomeCancelled},
		{ctx, io.ErrUnexpectedEOF, sluice.OutcomeErrored},
	} {
		if got := grpcgate.Outcome(tc.ctx, tc.err); got != tc.want {
			t.Errorf("Outcome(%v, %v) = %v, want %v", tc.ctx.Err(), tc.err, got, tc.want)
		}
	}
}

func TestCode(t *testing.T) {
	for _, tc := range []struct {
		d    sluice.Decision
		want codes.Code
	}{
		{sluice.Decision{Admitted: true}, codes.OK},
		{sluice.Decision{Reason: sluice.ReasonInvalid}, codes.InvalidArgument},
		{sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeService}, codes.ResourceExhausted},
		{sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeTenant}, codes.ResourceExhausted},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeTenant}, codes.ResourceExhausted},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeTenantOperation}, codes.ResourceExhausted},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeOperation}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonOverload}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonQueue}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonDeadline}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonDependency}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonUpstream, EffectPossible: true}, codes.Unavailable},
		{sluice.Decision{Reason: sluice.ReasonDeadline, EffectPossible: true}, codes.DeadlineExceeded},
	} {
		if got := grpcgate.Code(&tc.d); got != tc.want {
			t.Errorf("Code(%v %v) = %v, want %v", tc.d.Reason, tc.d.Scope, got, tc.want)
		}
	}
}

// A degradation level reaches the handler's context and the trailer.
func TestLevel(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	f.probe.mu.Lock()
	f.probe.level = sluice.LevelDegrade
	f.probe.mu.Unlock()
	var mu sync.Mutex
	var seen sluice.Level
	f.setUnary(func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		mu.Lock()
		seen = sluice.LevelFrom(ctx)
		mu.Unlock()
		return in, nil
	})
	r := f.call(t, "Unary")
	must(t, r.err)
	mu.Lock()
	defer mu.Unlock()
	if seen != sluice.LevelDegrade || one(t, r.trailer, grpcgate.LevelKey) != "degrade" {
		t.Fatalf("handler saw %v, trailer %v", seen, r.trailer)
	}
}

// HideCapacity and NoRateLimitMetadata leave the quota out.
func TestHideCapacity(t *testing.T) {
	for _, opts := range []grpcgate.Options{{Rules: testRules, HideCapacity: true}, {Rules: testRules, NoRateLimitMetadata: true}} {
		f := newFixture(t, 10, opts)
		r := f.call(t, "Unary", "x-api-key", "a")
		must(t, r.err)
		if len(r.trailer.Get("ratelimit")) != 0 || len(r.trailer.Get("ratelimit-policy")) != 0 {
			t.Fatalf("admitted trailer %v", r.trailer)
		}
		for range 4 {
			must(t, f.call(t, "Unary", "x-api-key", "a").err)
		}
		r = f.call(t, "Unary", "x-api-key", "a")
		if r.code() != codes.ResourceExhausted || len(r.trailer.Get("ratelimit")) != 0 || one(t, r.trailer, grpcgate.PushbackKey) != "10" {
			t.Fatalf("%v, trailer %v", r.err, r.trailer)
		}
		if msg := status.Convert(r.err).Message(); opts.HideCapacity && strings.Contains(msg, "5 requests") {
			t.Fatalf("message shows capacity: %q", msg)
		}
	}
}

func TestNoStatusDetails(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules, NoStatusDetails: true})
	for range 5 {
		must(t, f.call(t, "Unary", "x-api-key", "a").err)
	}
	r := f.call(t, "Unary", "x-api-key", "a")
	if r.code() != codes.ResourceExhausted || len(status.Convert(r.err).Details()) != 0 || one(t, r.trailer, grpcgate.PushbackKey) != "10" {
		t.Fatalf("%v, details %v, trailer %v", r.err, status.Convert(r.err).Details(), r.trailer)
	}
}

// Update swaps the chain for calls that start after it.
func TestUpdate(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules})
	must(t, f.call(t, "Unary").err)
	p := newProbe()
	p.reject = &sluice.Decision{Reason: sluice.ReasonOverload, Gate: "probe", Retryable: true, RetryAfter: 1500 * time.Millisecond}
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: f.clk}, p)
	must(t, err)
	must(t, f.ic.Update(chain, grpcgate.Options{Rules: testRules, Jitter: noJitter}))
	if f.ic.Chain() != chain {
		t.Fatal("Chain")
	}
	r := f.call(t, "Unary")
	if r.code() != codes.Unavailable || one(t, r.trailer, grpcgate.PushbackKey) != "1500" {
		t.Fatalf("%v, trailer %v", r.err, r.trailer)
	}
	if err := f.ic.Update(nil, grpcgate.Options{}); err == nil {
		t.Fatal("nil chain accepted")
	}
	if _, err := grpcgate.New(chain, grpcgate.Options{Rules: identify.Rules{Routes: []identify.Route{{Path: "no-slash"}}}}); err == nil {
		t.Fatal("bad route accepted")
	}
}

// Jitter spreads the pushback above the exact wait, never below it.
func TestPushbackJitter(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: testRules, Jitter: &grpcgateJitter})
	for range 5 {
		must(t, f.call(t, "Unary", "x-api-key", "a").err)
	}
	for range 20 {
		r := f.call(t, "Unary", "x-api-key", "a")
		if ms := atoi(t, one(t, r.trailer, grpcgate.PushbackKey)); ms < 10 || ms > 15 {
			t.Fatalf("pushback %d ms outside [10, 15]", ms)
		}
	}
}

// A tenant from the caller's address (the gRPC peer) and one from a claim
// of the bearer token in the authorization metadata.
func TestTenantFromPeerAndClaim(t *testing.T) {
	f := newFixture(t, 10, grpcgate.Options{Rules: identify.Rules{Tenant: identify.KeyRules{Parts: []identify.Part{identify.FromClientIP()}}}})
	must(t, f.call(t, "Unary", "x-forwarded-for", "198.51.100.1").err)
	if req, _ := f.probe.seen(); req.Tenant != "127.0.0.1" {
		t.Errorf("peer tenant %q, want 127.0.0.1 (x-forwarded-for from an untrusted peer ignored)", req.Tenant)
	}
	f.probe.nextRelease(t)

	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"org":"acme"}`))
	f = newFixture(t, 10, grpcgate.Options{Rules: identify.Rules{Tenant: identify.KeyRules{Parts: []identify.Part{identify.FromClaim("org")}}}})
	must(t, f.call(t, "Unary", "authorization", "Bearer e30."+claims+".c2ln").err)
	if req, _ := f.probe.seen(); req.Tenant != "acme" {
		t.Errorf("claim tenant %q, want acme", req.Tenant)
	}
	f.probe.nextRelease(t)
}
