package rlsserve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-go/sluice/grpcgate/rls"
)

// edgeConfig is the acceptance tests' configuration: a top-level key
// rule, a nested one under a value, unlimited, a shadow_mode rule, and
// the README's Example 7 pair for replaces.
const edgeConfig = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: free
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: internal
    rate_limit: {unlimited: true}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific_limit, unit: hour, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: hour
          requests_per_unit: 10
`

// now is the fixed clock's reading: 30 s into a minute, 810 s into an
// hour.
const now = 1_700_000_010

// edgeDir writes edgeConfig into a new folder.
func edgeDir(t *testing.T) string {
	dir := t.TempDir()
	writeFile(t, dir, "edge.yaml", edgeConfig)
	return dir
}

// desc builds a descriptor from key/value pairs.
func desc(kv ...string) *descpb.RateLimitDescriptor {
	d := &descpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &descpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *descpb.RateLimitDescriptor, n uint64) *descpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func req(domain string, hits uint32, ds ...*descpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

// Expected statuses.
func okStatus(limit uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32, reset int64) *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK,
		CurrentLimit:   &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: unit},
		LimitRemaining: remaining, DurationUntilReset: durationpb.New(time.Duration(reset) * time.Second)}
}

func overStatus(limit uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, reset int64) *rlspb.RateLimitResponse_DescriptorStatus {
	st := okStatus(limit, unit, 0, reset)
	st.Code = rlspb.RateLimitResponse_OVER_LIMIT
	return st
}

func named(st *rlspb.RateLimitResponse_DescriptorStatus, name string) *rlspb.RateLimitResponse_DescriptorStatus {
	st.CurrentLimit.Name = name
	return st
}

var noLimit = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}

const (
	okCode   = rlspb.RateLimitResponse_OK
	overCode = rlspb.RateLimitResponse_OVER_LIMIT
	second   = rlspb.RateLimitResponse_RateLimit_SECOND
	minute   = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour     = rlspb.RateLimitResponse_RateLimit_HOUR
)

func resp(overall rlspb.RateLimitResponse_Code, sts ...*rlspb.RateLimitResponse_DescriptorStatus) *rlspb.RateLimitResponse {
	return &rlspb.RateLimitResponse{OverallCode: overall, Statuses: sts}
}

// vector is one call and the exact answer.
type vector struct {
	name string
	req  *rlspb.RateLimitRequest
	want *rlspb.RateLimitResponse
}

// acceptanceVectors are run in order on one server at the fixed clock.
var acceptanceVectors = []vector{
	{"single", req("edge", 0, desc("tenant", "a")), resp(okCode, okStatus(5, minute, 4, 30))},
	{"single_hits_addend_3", req("edge", 3, desc("tenant", "a")), resp(okCode, okStatus(5, minute, 1, 30))},
	{"single_peek_uint64_0", req("edge", 3, withHits(desc("tenant", "a"), 0)), resp(okCode, okStatus(5, minute, 1, 30))},
	{"single_over", req("edge", 2, desc("tenant", "a")), resp(overCode, overStatus(5, minute, 30))},
	{"single_peek_when_over", req("edge", 0, withHits(desc("tenant", "a"), 0)), resp(overCode, overStatus(5, minute, 30))},
	{"descriptor_hits_replace_request_hits", req("edge", 4, withHits(desc("tenant", "b"), 1), desc("tenant", "c")),
		resp(okCode, okStatus(5, minute, 4, 30), okStatus(5, minute, 1, 30))},
	{"nested_1", req("edge", 0, desc("tenant", "free", "path", "/x")), resp(okCode, okStatus(2, second, 1, 1))},
	{"nested_2", req("edge", 0, desc("tenant", "free", "path", "/x")), resp(okCode, okStatus(2, second, 0, 1))},
	{"nested_over", req("edge", 0, desc("tenant", "free", "path", "/x")), resp(overCode, overStatus(2, second, 1))},
	{"nested_other_path", req("edge", 0, desc("tenant", "free", "path", "/y")), resp(okCode, okStatus(2, second, 1, 1))},
	{"parent_without_rule", req("edge", 0, desc("tenant", "free")), resp(okCode, noLimit)},
	{"no_rule", req("edge", 0, desc("nobody", "x")), resp(okCode, noLimit)},
	{"unlimited", req("edge", 7, desc("internal", "x")),
		resp(okCode, &rlspb.RateLimitResponse_DescriptorStatus{Code: okCode, LimitRemaining: math.MaxUint32})},
	{"second_of_two_over", req("edge", 0, desc("tenant", "d"), desc("tenant", "a")),
		resp(overCode, okStatus(5, minute, 4, 30), overStatus(5, minute, 30))},
	{"shadow_rule_1", req("edge", 0, desc("beta", "x")), resp(okCode, okStatus(1, minute, 0, 30))},
	{"shadow_rule_over_reported_ok", req("edge", 0, desc("beta", "x")), resp(okCode, okStatus(1, minute, 0, 30))},
	{"replaces", req("edge", 0, desc("key_1", "value_1", "user", "u"), desc("key_2", "value_2", "user", "u")),
		resp(okCode, noLimit, okStatus(10, hour, 9, 2790))},
	{"replaced_alone_applies", req("edge", 0, desc("key_1", "value_1", "user", "u")),
		resp(okCode, named(okStatus(5, hour, 4, 2790), "specific_limit"))},
	{"override", req("edge", 0, &descpb.RateLimitDescriptor{Entries: desc("tenant", "e").Entries,
		Limit: &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}}),
		resp(okCode, okStatus(1, hour, 0, 2790))},
	{"unknown_domain", req("nowhere", 0, desc("tenant", "a"), desc("x", "y")), resp(okCode, noLimit, noLimit)},
}

// The acceptance vectors over a real gRPC client on loopback, answered by
// the server the command builds, on memory, Redis and Redis Cluster, at a fixed clock:
// every answer exact.
func TestAcceptanceGRPC(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			r := start(t, Options{Config: edgeDir(t), Clock: newClock(now), Redis: b.redis, RedisPrefix: prefix(t), RedisTimeout: 2 * time.Second})
			for _, v := range acceptanceVectors {
				got, err := r.client.ShouldRateLimit(context.Background(), v.req)
				if err != nil {
					t.Fatalf("%s: %v", v.name, err)
				}
				if d := cmp.Diff(v.want, got, protocmp.Transform()); d != "" {
					t.Errorf("%s: (-want +got)\n%s", v.name, d)
				}
			}
			if n := metric(t, r, "sluice_rls_shadow_mode_total", `domain="edge"`, `key="beta"`); n != 1 {
				t.Errorf("shadow_mode hits %v, want 1 (the second call's, over the limit and let through)", n)
			}
			if n := metric(t, r, "sluice_rls_domain_not_found_total", `domain="nowhere"`); n != 1 {
				t.Errorf("domain_not_found %v, want 1", n)
			}
		})
	}
}

// backend is where the counters live.
type backend struct {
	name  string
	redis []string
}

// backends are memory, and a real redis-server and Redis Cluster (given
// by one node's address: --redis discovers the rest) when there is
// redis-server.
func backends(t *testing.T) []backend {
	bs := []backend{{name: "memory"}}
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("SLUICE_REQUIRE_REDIS") == "1" {
		srv := startRedis(t)
		bs = append(bs, backend{name: "redis", redis: []string{srv.addr}})
		if !testing.Short() {
			bs = append(bs, backend{name: "redis_cluster", redis: startCluster(t)[:1]})
		}
	}
	return bs
}

// prefix gives each test its own Redis keys.
func prefix(t *testing.T) string {
	return "rlsserve-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
}

// The global shadow mode (--shadow) turns the overall OVER_LIMIT into OK
// and leaves the statuses; the peer's headers (--headers peer) are the
// most constrained descriptor's; draft headers are RateLimit-Policy and
// RateLimit.
func TestShadowModeAndHeaders(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now), ShadowMode: true, Headers: rls.HeadersPeer})
	ctx := context.Background()
	for range 5 {
		if _, err := r.client.ShouldRateLimit(ctx, req("edge", 0, desc("tenant", "a"))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.client.ShouldRateLimit(ctx, req("edge", 0, desc("tenant", "b"), desc("tenant", "a")))
	if err != nil {
		t.Fatal(err)
	}
	want := resp(okCode, okStatus(5, minute, 4, 30), overStatus(5, minute, 30))
	want.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "RateLimit-Limit", Value: "5"}, {Key: "RateLimit-Remaining", Value: "0"}, {Key: "RateLimit-Reset", Value: "30"}}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
	if n := metric(t, r, "sluice_rls_global_shadow_mode_total"); n != 1 {
		t.Errorf("global_shadow_mode %v, want 1", n)
	}

	d := start(t, Options{Config: edgeDir(t), Clock: newClock(now), Headers: rls.HeadersDraft})
	got, err = d.client.ShouldRateLimit(ctx, req("edge", 2, desc("tenant", "a")))
	if err != nil {
		t.Fatal(err)
	}
	hs := map[string]string{}
	for _, h := range got.GetResponseHeadersToAdd() {
		hs[h.GetKey()] = h.GetValue()
	}
	if hs["RateLimit-Policy"] != `"tenant";q=5;w=60` || hs["RateLimit"] != `"tenant";r=3;t=30` {
		t.Errorf("draft headers %q", hs)
	}
}

// Malformed calls get a clear gRPC status, INVALID_ARGUMENT with a message
// (RESOURCE_EXHAUSTED for a message over the size bound), never a panic:
// the server answers normally afterwards.
func TestMalformedRequests(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now)})
	many := make([]*descpb.RateLimitDescriptor, 10000)
	for i := range many {
		many[i] = desc("tenant", fmt.Sprint(i))
	}
	huge := make([]*descpb.RateLimitDescriptor, 40000)
	for i := range huge {
		huge[i] = desc("tenant", strings.Repeat("v", 20))
	}
	cases := []struct {
		name string
		req  *rlspb.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{"empty_domain", req("", 0, desc("tenant", "a")), codes.InvalidArgument, "domain must not be empty"},
		{"no_descriptors", req("edge", 0), codes.InvalidArgument, "descriptor list must not be empty"},
		{"empty_descriptor", req("edge", 0, &descpb.RateLimitDescriptor{}), codes.InvalidArgument, "descriptors[0] has no entries"},
		{"empty_key", req("edge", 0, desc("", "a")), codes.InvalidArgument, "descriptors[0].entries[0].key is empty"},
		{"huge_hits_addend", req("edge", 0, withHits(desc("tenant", "a"), 1<<40)), codes.InvalidArgument, "hits_addend 1099511627776 is more than 4294967295"},
		{"max_uint64_hits_addend", req("edge", 0, withHits(desc("tenant", "a"), math.MaxUint64)), codes.InvalidArgument, "hits_addend"},
		{"10k_descriptors", req("edge", 0, many...), codes.InvalidArgument, "10000 descriptors, more than the 64 a call may carry"},
		{"unknown_override_unit", req("edge", 0, &descpb.RateLimitDescriptor{Entries: desc("tenant", "a").Entries,
			Limit: &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit(42)}}), codes.InvalidArgument, "limit unit 42"},
		{"override_unit_unknown", req("edge", 0, &descpb.RateLimitDescriptor{Entries: desc("tenant", "a").Entries,
			Limit: &descpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}), codes.InvalidArgument, "limit.unit 0 is not a unit"},
		{"over_1MiB", req("edge", 0, huge...), codes.ResourceExhausted, "larger than max"},
	}
	for _, c := range cases {
		_, err := r.client.ShouldRateLimit(context.Background(), c.req)
		st, _ := status.FromError(err)
		if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
			t.Errorf("%s: %v, want %v with %q", c.name, err, c.code, c.msg)
		}
	}
	got, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a")))
	if err != nil || got.GetOverallCode() != okCode {
		t.Fatalf("after the malformed calls: %v %v", got, err)
	}
	if n := metric(t, r, "sluice_rls_calls_total", `result="invalid"`); n < 7 {
		t.Errorf("invalid calls counted %v, want at least 7", n)
	}
}

// The /json endpoint mirrors gRPC: the same calls on two servers of the
// same configuration and clock, one over gRPC and one as proto3 JSON over
// HTTP, give equal responses, with 200 for OK, 429 for OVER_LIMIT and 400
// where gRPC says INVALID_ARGUMENT.
func TestJSONMirrorsGRPC(t *testing.T) {
	g := start(t, Options{Config: edgeDir(t), Clock: newClock(now), Headers: rls.HeadersPeer})
	j := start(t, Options{Config: edgeDir(t), Clock: newClock(now), Headers: rls.HeadersPeer})
	calls := []*rlspb.RateLimitRequest{}
	for _, v := range acceptanceVectors {
		calls = append(calls, v.req)
	}
	calls = append(calls, req("", 0, desc("tenant", "a")), req("edge", 0), req("edge", 0, withHits(desc("tenant", "a"), 1<<40)))
	statuses := map[int]int{}
	for i, c := range calls {
		gr, gerr := g.client.ShouldRateLimit(context.Background(), c)
		body, err := protojson.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		hr, err := http.Post(j.httpURL+JSONPath, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(hr.Body)
		hr.Body.Close()
		statuses[hr.StatusCode]++
		if gerr != nil {
			if status.Code(gerr) != codes.InvalidArgument || hr.StatusCode != http.StatusBadRequest {
				t.Errorf("call %d: gRPC %v, HTTP %d %s", i, gerr, hr.StatusCode, out)
			}
			continue
		}
		want := http.StatusOK
		if gr.GetOverallCode() == overCode {
			want = http.StatusTooManyRequests
		}
		jr := &rlspb.RateLimitResponse{}
		if err := protojson.Unmarshal(out, jr); err != nil {
			t.Fatalf("call %d: %v: %s", i, err, out)
		}
		if hr.StatusCode != want || !proto.Equal(gr, jr) {
			t.Errorf("call %d: HTTP %d %s\ngRPC %v", i, hr.StatusCode, out, gr)
		}
	}
	if statuses[200] == 0 || statuses[429] == 0 || statuses[400] != 3 {
		t.Errorf("statuses %v: want some 200s, some 429s and three 400s", statuses)
	}
}

// The listeners' other endpoints: /healthcheck (the peer's), gRPC health,
// /healthz, /metrics and /rlconfig on the admin listener.
func TestHealthAndAdmin(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now)})
	if code, body := get(t, r.httpURL+HealthcheckPath); code != 200 || body != "OK" {
		t.Errorf("healthcheck: %d %q", code, body)
	}
	h, err := healthpb.NewHealthClient(r.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health: %v %v", h, err)
	}
	if code, body := get(t, r.adminURL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthz: %d %q", code, body)
	}
	if code, body := get(t, r.adminURL+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("readyz: %d %q", code, body)
	}
	if code, body := get(t, r.adminURL+"/metrics"); code != 200 || !strings.Contains(body, "sluice_build_info{") {
		t.Errorf("no sluice_build_info in /metrics: %d", code)
	}
	if code, body := get(t, r.adminURL+RulesPath); code != 200 || !strings.Contains(body, "edge.tenant_free.path: 2/SECOND") {
		t.Errorf("rlconfig: %d %q", code, body)
	}
	if _, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a"))); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, r, "sluice_rls_calls_total", `result="ok"`); n != 1 {
		t.Errorf("calls ok %v, want 1", n)
	}
	if code, _ := get(t, r.httpURL+JSONPath); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /json: %d", code)
	}
}

// A changed configuration is loaded on change (once two checks read the
// same content) and on Reload (SIGHUP), the counters carried over; an
// invalid one is refused with its file and line logged, and the old one
// keeps serving.
func TestReload(t *testing.T) {
	dir := edgeDir(t)
	r := start(t, Options{Config: dir, Clock: newClock(now)})
	ctx := context.Background()
	call := func() *rlspb.RateLimitResponse_DescriptorStatus {
		t.Helper()
		got, err := r.client.ShouldRateLimit(ctx, req("edge", 0, desc("tenant", "a")))
		if err != nil {
			t.Fatal(err)
		}
		return got.GetStatuses()[0]
	}
	if st := call(); st.GetLimitRemaining() != 4 {
		t.Fatalf("before: %v", st)
	}
	writeFile(t, dir, "edge.yaml", strings.Replace(edgeConfig, "requests_per_unit: 5}", "requests_per_unit: 50}", 1))
	r.tick() // sees the change
	if st := call(); st.GetCurrentLimit().GetRequestsPerUnit() != 5 {
		t.Errorf("loaded after one check: %v", st)
	}
	r.tick() // reads it again: loads it
	r.tick() // (the previous tick is done)
	if st := call(); st.GetCurrentLimit().GetRequestsPerUnit() != 50 || st.GetLimitRemaining() != 50-3 {
		t.Errorf("after the reload: %v, want 50 with 47 left (the window's 3 hits carried over)", st)
	}

	// A second domain in a file of its own, then an invalid file.
	writeFile(t, dir, "other.yaml", "domain: other\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: 1}}\n")
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload: %v %v", changed, err)
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("Reload of the same files: %v %v", changed, err)
	}
	bad := writeFile(t, dir, "bad.yaml", "domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if changed, err := r.Reload(); changed || err == nil {
		t.Fatalf("Reload of an invalid file: %v %v", changed, err)
	}
	if changed, err := r.Reload(); changed || !errors.Is(err, ErrRefusedBefore) {
		t.Fatalf("Reload of the invalid file again: %v %v, want ErrRefusedBefore (a SIGHUP's answer)", changed, err)
	}
	r.tick()
	r.tick()
	r.tick()
	if want := bad + ":4: descriptors[0].rate_limit.unit"; !strings.Contains(r.log.String(), want) {
		t.Errorf("the log does not name %q:\n%s", want, r.log.String())
	}
	if strings.Count(r.log.String(), "reload refused") != 1 {
		t.Errorf("the refusal is logged %d times, want once:\n%s", strings.Count(r.log.String(), "reload refused"), r.log.String())
	}
	if st := call(); st.GetCurrentLimit().GetRequestsPerUnit() != 50 {
		t.Errorf("after the refused file: %v, want the old configuration", st)
	}
	got, err := r.client.ShouldRateLimit(ctx, req("other", 0, desc("k", "v")))
	if err != nil || got.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Errorf("the other domain: %v %v", got, err)
	}
	if n := metric(t, r, "sluice_rls_config_reloads_total", `result="loaded"`); n != 2 {
		t.Errorf("reloads loaded %v, want 2", n)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	// The files are again those serving: nothing to load, nothing wrong.
	if changed, err := r.Reload(); changed || err != nil {
		t.Errorf("Reload once the invalid file is gone: %v %v", changed, err)
	}
}

// New refuses a configuration that does not load, with every error's
// file and line.
func TestNewRefusesInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n  - {key: \"\", rate_limit: {unit: minute, requests_per_unit: 1}}\n")
	_, err := New(Options{Config: p})
	if err == nil || !strings.Contains(err.Error(), p+":4:") || !strings.Contains(err.Error(), p+":5:") {
		t.Fatalf("%v", err)
	}
	if _, err := New(Options{Config: filepath.Join(dir, "missing.yaml")}); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

// Run stops gracefully on its context: a call in flight (waiting for a
// paused Redis here) finishes with its answer, new calls are refused, and
// Run returns.
func TestGracefulShutdown(t *testing.T) {
	redis := startRedis(t)
	r := start(t, Options{Config: edgeDir(t), Redis: []string{redis.addr}, RedisTimeout: time.Second, OnFailure: rls.FailOpen,
		ShutdownTimeout: 10 * time.Second})
	if _, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a"))); err != nil {
		t.Fatal(err)
	}
	redis.pause()
	defer redis.resume()
	inFlight := make(chan error, 1)
	go func() {
		resp, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "b")))
		if err == nil && resp.GetOverallCode() != okCode {
			err = fmt.Errorf("answered %v", resp)
		}
		inFlight <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is waiting for Redis
	g, _, _ := r.Addrs()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	r.stopped = true
	if err := <-inFlight; err != nil {
		t.Errorf("the call in flight at the shutdown: %v, want its answer (OK, failing open after the Redis timeout)", err)
	}
	r.conn.Close()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req("edge", 0, desc("tenant", "a"))); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a call after the shutdown: %v", err)
	}
}

// With a drain delay, the service keeps accepting and answering after its
// context ends, its health checks already failing (/readyz 503, the
// peer's /healthcheck 500, gRPC health NOT_SERVING) so that load balancers
// stop sending first; the listeners close when the delay is over.
func TestDrainDelayKeepsServing(t *testing.T) {
	delay := make(chan time.Time)
	asked := make(chan time.Duration, 1)
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now), DrainDelay: 7 * time.Second,
		DrainAfter: func(d time.Duration) <-chan time.Time { asked <- d; return delay }})
	g, h, _ := r.Addrs()
	r.stop()
	if d := <-asked; d != 7*time.Second {
		t.Fatalf("drain delay %v, want 7s", d)
	}
	if code, _ := get(t, r.adminURL+"/readyz"); code != 503 {
		t.Errorf("/readyz during the drain delay: %d, want 503", code)
	}
	if code, _ := get(t, r.httpURL+HealthcheckPath); code != 500 {
		t.Errorf("/healthcheck during the drain delay: %d, want 500", code)
	}
	// A new connection is accepted and served, on gRPC and on /json.
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health during the drain delay: %v %v, want NOT_SERVING", hc, err)
	}
	resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a")))
	if err != nil || resp.GetOverallCode() != okCode {
		t.Errorf("a call on a new connection during the drain delay: %v %v", resp, err)
	}
	body, _ := protojson.Marshal(req("edge", 0, desc("tenant", "a")))
	hr, err := http.Post(r.httpURL+JSONPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != 200 || !hr.Close {
		t.Errorf("/json during the drain delay: %d, connection closed after it: %v (want 200, true)", hr.StatusCode, hr.Close)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned during the drain delay: %v", err)
	default:
	}
	close(delay)
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.stopped = true
	r.conn.Close()
	for _, a := range []string{g.String(), h.String()} {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts after the drain", a)
		}
	}
}

// A call still in progress when the shutdown timeout runs out is cut with
// its connection, and the log says how many were (it said only that some
// were).
func TestShutdownLogsTheCallsItCuts(t *testing.T) {
	r := start(t, Options{Config: edgeDir(t), Clock: newClock(now), ShutdownTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A call whose message never comes, on a connection of its own (the
	// test's is closed first): its handler waits for it.
	g, _, _ := r.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.grpc.InProgress() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in progress, want the stalled one", r.grpc.InProgress())
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.shutdown(t)
	if log := r.log.String(); !strings.Contains(log, "calls_cut=1") {
		t.Errorf("the shutdown's log does not count the call it cut:\n%s", log)
	}
}

// A configuration file deleted (or made unreadable) under the watcher is
// logged once, not once a tick, and the old configuration keeps serving
// (nothing was logged).
func TestWatcherLogsAnUnreadableConfigOnce(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "edge.yaml", edgeConfig)
	r := start(t, Options{Config: p, Clock: newClock(now)})
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		r.tick()
	}
	r.tick() // the previous tick is done
	if n := strings.Count(r.log.String(), "configuration unreadable"); n != 1 {
		t.Errorf("the unreadable file is logged %d times, want once:\n%s", n, r.log.String())
	}
	if _, err := r.client.ShouldRateLimit(context.Background(), req("edge", 0, desc("tenant", "a"))); err != nil {
		t.Errorf("a call after the file went: %v", err)
	}
}
