package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/grpcgate/envoyrls"
	"github.com/sluice-go/sluice/grpcgate/rls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeService records the last request and answers with answer, or, by
// default, refuses what the real service refuses (no domain, no
// descriptors, more than 1000, an empty key) and gives each descriptor OK
// with its override or 10 per minute, minus its hits.
type fakeService struct {
	mu     sync.Mutex
	last   *rls.Request
	calls  int
	answer func(r *rls.Request) (*rls.Response, error)
}

func (f *fakeService) ShouldRateLimit(_ context.Context, r *rls.Request) (*rls.Response, error) {
	f.mu.Lock()
	f.last, f.calls = r, f.calls+1
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		return answer(r)
	}
	switch {
	case r.Domain == "":
		return nil, fmt.Errorf("%w: no domain", rls.ErrInvalid)
	case len(r.Descriptors) == 0:
		return nil, fmt.Errorf("%w: no descriptors", rls.ErrInvalid)
	case len(r.Descriptors) > 1000:
		return nil, fmt.Errorf("%w: %d descriptors, at most 1000", rls.ErrInvalid, len(r.Descriptors))
	}
	resp := &rls.Response{Overall: rls.CodeOK}
	for i, d := range r.Descriptors {
		if len(d.Entries) == 0 || d.Entries[0].Key == "" {
			return nil, fmt.Errorf("%w: descriptor %d: empty", rls.ErrInvalid, i)
		}
		lim := rls.Limit{Name: "default", RequestsPerUnit: 10, Unit: rls.Minute}
		if d.Limit != nil {
			lim = rls.Limit{Name: "override", RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: d.Limit.Unit}
		}
		hits := uint64(max(r.Hits, 1))
		if d.Hits != nil {
			hits = *d.Hits
		}
		st := rls.Status{Code: rls.CodeOK, Limit: &lim, ResetIn: 30 * time.Second}
		if hits > uint64(lim.RequestsPerUnit) {
			st.Code, resp.Overall = rls.CodeOverLimit, rls.CodeOverLimit
		} else {
			st.Remaining = lim.RequestsPerUnit - uint32(hits)
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

func (f *fakeService) seen() (*rls.Request, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.calls
}

func (f *fakeService) setAnswer(fn func(r *rls.Request) (*rls.Response, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = fn
}

// newClient serves srv over loopback and returns a client of it.
func newClient(t *testing.T, srv *envoyrls.Server, sopts ...grpc.ServerOption) rlspb.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(sopts...)
	envoyrls.Register(gs, srv)
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop(); <-done })
	return rlspb.NewRateLimitServiceClient(conn)
}

func newFixture(t *testing.T, opts envoyrls.Options) (*fakeService, *envoyrls.Server, rlspb.RateLimitServiceClient) {
	t.Helper()
	fs := &fakeService{}
	srv, err := envoyrls.New(fs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return fs, srv, newClient(t, srv, srv.ServerOptions()...)
}

func call(t *testing.T, c rlspb.RateLimitServiceClient, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, req)
}

func desc(kv ...string) *descpb.RateLimitDescriptor {
	d := &descpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &descpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func u64(v uint64) *uint64 { return &v }

func ents(kv ...string) []rls.Entry {
	var es []rls.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, rls.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestSingleDescriptor(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	resp, err := call(t, c, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*descpb.RateLimitDescriptor{desc("tenant", "t42")}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := fs.seen()
	want := &rls.Request{Domain: "edge", Descriptors: []rls.Descriptor{{Entries: []rls.Entry{{Key: "tenant", Value: "t42"}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("service saw %+v", got)
	}
	if resp.OverallCode != rlspb.RateLimitResponse_OK || len(resp.Statuses) != 1 {
		t.Fatalf("response %v", resp)
	}
	s := resp.Statuses[0]
	if s.Code != rlspb.RateLimitResponse_OK || s.LimitRemaining != 9 || s.DurationUntilReset.AsDuration() != 30*time.Second ||
		s.CurrentLimit.GetName() != "default" || s.CurrentLimit.GetRequestsPerUnit() != 10 || s.CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("status %v", s)
	}
}

// Nested descriptors (several entries each) arrive in order, and the
// statuses come back in the same order.
func TestNestedDescriptors(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	req := &rlspb.RateLimitRequest{Domain: "edge", HitsAddend: 5, Descriptors: []*descpb.RateLimitDescriptor{
		desc("tenant", "t42", "path", "/v1/orders"),
		desc("remote_address", "10.0.0.1"),
		{Entries: desc("tenant", "t42", "method", "POST", "path", "/v1/orders").Entries, Limit: &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}},
	}}
	resp, err := call(t, c, req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := fs.seen()
	want := &rls.Request{Domain: "edge", Hits: 5, Descriptors: []rls.Descriptor{
		{Entries: ents("tenant", "t42", "path", "/v1/orders")},
		{Entries: ents("remote_address", "10.0.0.1")},
		{Entries: ents("tenant", "t42", "method", "POST", "path", "/v1/orders"), Limit: &rls.Override{RequestsPerUnit: 3, Unit: rls.Minute}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("service saw %+v", got)
	}
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 3 {
		t.Fatalf("response %v", resp)
	}
	for i, wantCode := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		if resp.Statuses[i].Code != wantCode {
			t.Errorf("status %d: %v", i, resp.Statuses[i])
		}
	}
	if l := resp.Statuses[2].CurrentLimit; l.GetName() != "override" || l.GetRequestsPerUnit() != 3 {
		t.Errorf("override limit %v", l)
	}
	if resp.Statuses[0].LimitRemaining != 5 {
		t.Errorf("hits_addend 5 left %d of 10", resp.Statuses[0].LimitRemaining)
	}
}

// Per-descriptor hits_addend is a pointer: unset, 0 (check without
// consuming) and a value are three different things; is_negative_hits
// rides along.
func TestDescriptorHits(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	req := &rlspb.RateLimitRequest{Domain: "d", HitsAddend: 2, Descriptors: []*descpb.RateLimitDescriptor{
		desc("a", "1"),
		{Entries: desc("b", "2").Entries, HitsAddend: wrapperspb.UInt64(0)},
		{Entries: desc("c", "3").Entries, HitsAddend: wrapperspb.UInt64(7)},
		{Entries: desc("d", "4").Entries, HitsAddend: wrapperspb.UInt64(4), IsNegativeHits: true},
		{Entries: desc("e", "5").Entries, HitsAddend: wrapperspb.UInt64(1 << 40)},
	}}
	resp, err := call(t, c, req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := fs.seen()
	want := []rls.Descriptor{
		{Entries: ents("a", "1")},
		{Entries: ents("b", "2"), Hits: u64(0)},
		{Entries: ents("c", "3"), Hits: u64(7)},
		{Entries: ents("d", "4"), Hits: u64(4), Negative: true},
		{Entries: ents("e", "5"), Hits: u64(1 << 40)},
	}
	if got.Hits != 2 || !reflect.DeepEqual(got.Descriptors, want) {
		t.Fatalf("service saw %+v", got)
	}
	if r := []uint32{resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining, resp.Statuses[2].LimitRemaining}; r[0] != 8 || r[1] != 10 || r[2] != 3 {
		t.Fatalf("remaining %v", r)
	}
}

// Override units are translated by name, every value of
// envoy.type.v3.RateLimitUnit; a number it does not name, and a
// unit_multiplier other than 1, are INVALID_ARGUMENT.
func TestOverrideUnits(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	want := map[string]rls.Unit{"UNKNOWN": rls.UnitUnknown, "SECOND": rls.Second, "MINUTE": rls.Minute, "HOUR": rls.Hour, "DAY": rls.Day, "MONTH": rls.Month, "YEAR": rls.Year}
	if len(want) != len(typev3.RateLimitUnit_name) {
		t.Fatalf("RateLimitUnit has %d names: %v", len(typev3.RateLimitUnit_name), typev3.RateLimitUnit_name)
	}
	for name, u := range want {
		pu := typev3.RateLimitUnit(typev3.RateLimitUnit_value[name])
		d := desc("k", "v")
		d.Limit = &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: pu}
		if name == "HOUR" {
			d.Limit.UnitMultiplier = wrapperspb.UInt32(1)
		}
		if _, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{d}}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, _ := fs.seen()
		if l := got.Descriptors[0].Limit; l == nil || l.Unit != u || l.RequestsPerUnit != 3 {
			t.Errorf("%s: override %+v, want unit %d", name, l, u)
		}
	}
	for _, bad := range []*descpb.RateLimitDescriptor_RateLimitOverride{
		{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit(7)}, // WEEK exists in responses only
		{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit(-1)},
		{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)},
		{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)},
	} {
		_, calls := fs.seen()
		d := desc("k", "v")
		d.Limit = bad
		_, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{d}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("override %v: %v", bad, err)
		}
		if _, now := fs.seen(); now != calls {
			t.Errorf("override %v reached the service", bad)
		}
	}
}

// Response units are translated by name, WEEK (7, after YEAR 6) included;
// a unit the response enum does not name is UNKNOWN; verdicts likewise.
func TestResponseUnits(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	units := map[rls.Unit]string{
		rls.UnitUnknown: "UNKNOWN", rls.Second: "SECOND", rls.Minute: "MINUTE", rls.Hour: "HOUR", rls.Day: "DAY",
		rls.Week: "WEEK", rls.Month: "MONTH", rls.Year: "YEAR", rls.Unit(42): "UNKNOWN",
	}
	var order []rls.Unit
	for u := range units {
		order = append(order, u)
	}
	fs.setAnswer(func(r *rls.Request) (*rls.Response, error) {
		resp := &rls.Response{Overall: rls.Code(9)}
		for _, u := range order {
			resp.Statuses = append(resp.Statuses, rls.Status{Code: rls.CodeOverLimit, Limit: &rls.Limit{Name: "n", RequestsPerUnit: 1, Unit: u}})
		}
		return resp, nil
	})
	var ds []*descpb.RateLimitDescriptor
	for range order {
		ds = append(ds, desc("k", "v"))
	}
	resp, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlspb.RateLimitResponse_UNKNOWN {
		t.Errorf("overall %v", resp.OverallCode)
	}
	for i, u := range order {
		if got := resp.Statuses[i].CurrentLimit.Unit.String(); got != units[u] {
			t.Errorf("unit %d: %s, want %s", u, got, units[u])
		}
		if resp.Statuses[i].Code != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("code %v", resp.Statuses[i].Code)
		}
	}
	if rlspb.RateLimitResponse_RateLimit_WEEK != 7 {
		t.Fatal("WEEK moved")
	}
}

// A status without a limit (no rule matched) has no current_limit; the
// service's headers become response_headers_to_add.
func TestNoLimitAndHeaders(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	fs.setAnswer(func(r *rls.Request) (*rls.Response, error) {
		return &rls.Response{Overall: rls.CodeOK, Statuses: []rls.Status{{Code: rls.CodeOK, Remaining: 4294967295}},
			Headers: []rls.Header{{Name: "RateLimit", Value: `"d";r=4;t=30`}, {Name: "RateLimit-Policy", Value: `"d";q=10;w=60`}}}, nil
	})
	resp, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	s := resp.Statuses[0]
	if s.CurrentLimit != nil || s.DurationUntilReset != nil || s.LimitRemaining != 4294967295 {
		t.Fatalf("status %v", s)
	}
	if hs := resp.ResponseHeadersToAdd; len(hs) != 2 || hs[0].Key != "RateLimit" || hs[0].Value != `"d";r=4;t=30` || hs[1].Key != "RateLimit-Policy" {
		t.Fatalf("headers %v", hs)
	}
}

func TestErrorsToCodes(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	req := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{desc("k", "v")}}
	for _, tc := range []struct {
		name   string
		answer func(*rls.Request) (*rls.Response, error)
		want   codes.Code
	}{
		{"invalid", func(*rls.Request) (*rls.Response, error) {
			return nil, fmt.Errorf("%w: hits out of range", rls.ErrInvalid)
		}, codes.InvalidArgument},
		{"unavailable", func(*rls.Request) (*rls.Response, error) { return nil, fmt.Errorf("redis: %w", rls.ErrUnavailable) }, codes.Unavailable},
		{"other", func(*rls.Request) (*rls.Response, error) { return nil, errors.New("boom") }, codes.Internal},
		{"deadline", func(*rls.Request) (*rls.Response, error) { return nil, context.DeadlineExceeded }, codes.DeadlineExceeded},
		{"status", func(*rls.Request) (*rls.Response, error) { return nil, status.Error(codes.PermissionDenied, "no") }, codes.PermissionDenied},
		{"no response", func(*rls.Request) (*rls.Response, error) { return nil, nil }, codes.Internal},
		{"short", func(*rls.Request) (*rls.Response, error) { return &rls.Response{Overall: rls.CodeOK}, nil }, codes.Internal},
	} {
		fs.setAnswer(tc.answer)
		_, err := call(t, c, req)
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.name == "invalid" && !strings.Contains(status.Convert(err).Message(), "hits out of range") {
			t.Errorf("message %q", status.Convert(err).Message())
		}
	}
}

// Empty messages and nil fields never panic: on the wire they arrive as
// empty, in process they are read as empty; the service refuses them.
func TestNilAndEmpty(t *testing.T) {
	fs, srv, c := newFixture(t, envoyrls.Options{})
	if _, err := call(t, c, &rlspb.RateLimitRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty request: %v", err)
	}
	if got, _ := fs.seen(); got.Domain != "" || got.Descriptors != nil || got.Hits != 0 {
		t.Fatalf("service saw %+v", got)
	}
	if _, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{{}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty descriptor: %v", err)
	}
	ctx := context.Background()
	if _, err := srv.ShouldRateLimit(ctx, nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("nil request: %v", err)
	}
	odd := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{
		nil,
		{Entries: []*descpb.RateLimitDescriptor_Entry{nil, {Key: "k"}}},
		{Limit: &descpb.RateLimitDescriptor_RateLimitOverride{}, HitsAddend: &wrapperspb.UInt64Value{}},
	}}
	fs.setAnswer(func(r *rls.Request) (*rls.Response, error) {
		return &rls.Response{Statuses: make([]rls.Status, len(r.Descriptors))}, nil
	})
	resp, err := srv.ShouldRateLimit(ctx, odd)
	if err != nil || len(resp.Statuses) != 3 {
		t.Fatalf("nil fields: %v, %v", resp, err)
	}
	got, _ := fs.seen()
	want := []rls.Descriptor{{Entries: []rls.Entry{}}, {Entries: []rls.Entry{{}, {Key: "k"}}}, {Entries: []rls.Entry{}, Limit: &rls.Override{}, Hits: u64(0)}}
	if !reflect.DeepEqual(got.Descriptors, want) {
		t.Fatalf("service saw %+v", got.Descriptors)
	}
	// A response of nothing at all for no descriptors is a valid answer.
	if resp, err := srv.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "d"}); err != nil || len(resp.Statuses) != 0 || resp.OverallCode != rlspb.RateLimitResponse_UNKNOWN {
		t.Fatalf("no descriptors: %v, %v", resp, err)
	}
	if _, err := envoyrls.New(nil, envoyrls.Options{}); err == nil {
		t.Fatal("nil service accepted")
	}
}

// 10,000 descriptors fit the default size bound and reach the service,
// which is the one to refuse them.
func TestManyDescriptorsReachTheService(t *testing.T) {
	fs, _, c := newFixture(t, envoyrls.Options{})
	ds := make([]*descpb.RateLimitDescriptor, 10000)
	for i := range ds {
		ds[i] = desc("tenant", fmt.Sprint(i))
	}
	_, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: ds})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "10000 descriptors") {
		t.Fatalf("10k descriptors: %v", err)
	}
	if got, _ := fs.seen(); len(got.Descriptors) != 10000 || got.Descriptors[9999].Entries[0].Value != "9999" {
		t.Fatalf("service saw %d descriptors", len(got.Descriptors))
	}
}

// A request over MaxRequestBytes is RESOURCE_EXHAUSTED, refused by gRPC
// itself on a server built with ServerOptions and by the handler on one
// built without; it never reaches the service.
func TestMaxRequestBytes(t *testing.T) {
	big := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{desc("k", strings.Repeat("v", 4096))}}
	fs := &fakeService{}
	srv, err := envoyrls.New(fs, envoyrls.Options{MaxRequestBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]rlspb.RateLimitServiceClient{
		"server option": newClient(t, srv, srv.ServerOptions()...),
		"handler":       newClient(t, srv),
	} {
		if _, err := call(t, c, big); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := call(t, c, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*descpb.RateLimitDescriptor{desc("k", "v")}}); err != nil {
			t.Errorf("%s: small request: %v", name, err)
		}
	}
	if _, n := fs.seen(); n != 2 {
		t.Fatalf("the service saw %d calls", n)
	}
	// A negative bound turns the handler's check off.
	srv, _ = envoyrls.New(fs, envoyrls.Options{MaxRequestBytes: -1})
	if len(srv.ServerOptions()) != 0 {
		t.Fatal("server options for no bound")
	}
	if _, err := srv.ShouldRateLimit(context.Background(), big); err != nil {
		t.Fatal(err)
	}
}

// Envoy's response-time call (a rate limit action with
// apply_on_stream_done: the descriptor's hits_addend is what the response
// said, sent when the stream ends) counts like any other call, over real
// gRPC: a request-time hit and a response-time 4 leave 5 of the 10, and
// the next request-time call sees them spent.
func TestResponseTimeCallCounts(t *testing.T) {
	cfg, err := rls.Parse("edge.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(cfg, rls.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyrls.New(svc, envoyrls.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv, srv.ServerOptions()...)
	remaining := func(d *descpb.RateLimitDescriptor) uint32 {
		t.Helper()
		resp, err := call(t, c, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*descpb.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].LimitRemaining
	}
	d := desc("tenant", "t7")
	if r := remaining(d); r != 9 {
		t.Fatalf("request-time call: %d left of 10", r)
	}
	if r := remaining(&descpb.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(4)}); r != 5 {
		t.Fatalf("response-time call of 4: %d left, want 5", r)
	}
	if r := remaining(d); r != 4 {
		t.Fatalf("the next request-time call: %d left, want 4", r)
	}
}
