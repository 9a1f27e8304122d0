package rls

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/redistest"
	sredis "github.com/sluice-go/sluice/store/redis"
)

func TestMain(m *testing.M) {
	// rueidis' cluster client may leave a topology refresh sleeping for a
	// few seconds after Close; it ends on its own (as in store/redis).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// sec is a Unix time in seconds as a fake clock reading.
func sec(s int64) int64 { return s * int64(time.Second) }

// backend makes Servers on one store kind, each with its own keys, on a
// fake clock that the Redis scripts decide on too.
type backend struct {
	name  string
	addrs []string // nil: memory
}

var prefixes atomic.Int64

func (b backend) server(t testing.TB, cfg *Config, opts Options) (*Server, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New(sec(2222))
	opts.Clock = clk
	if b.addrs != nil {
		st, err := sredis.New(sredis.Options{Addrs: b.addrs, Timeout: 2 * time.Second, DecisionClock: clk,
			Prefix: fmt.Sprintf("rlstest%d", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		opts.Redis = st
		if opts.Timeout == 0 {
			opts.Timeout = 2 * time.Second
		}
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

// backends returns memory, and Redis standalone and Cluster when
// redis-server is installed (required with SLUICE_REQUIRE_REDIS=1).
func backends(t *testing.T, cluster bool) []backend {
	out := []backend{{name: "memory"}}
	if testing.Short() {
		return out
	}
	out = append(out, backend{name: "redis", addrs: []string{startRedis(t)}})
	if cluster {
		cl := redistest.StartCluster(t, 3)
		out = append(out, backend{name: "cluster", addrs: cl.Addrs})
	}
	return out
}

// startRedis starts a redis-server for t and returns its address.
func startRedis(t testing.TB) string { return redistest.Start(t).Addr }

// counter reads one of the Server's counters, e.g. ("sluice_rls_over_limit_total", "test-domain", "key2").
func counter(t testing.TB, s *Server, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := s.Registry().(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i, l := range m.GetLabel() {
				if i >= len(labels) || l.GetValue() != labels[i] {
					continue metrics
				}
			}
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// d is a descriptor of key/value pairs.
func d(kv ...string) Descriptor { return Descriptor{Entries: ents(kv...)} }

// dh is a descriptor with hits of its own.
func dh(hits uint64, kv ...string) Descriptor {
	x := d(kv...)
	x.Hits = &hits
	return x
}

// dover is a descriptor with a limit override.
func dover(rpu uint32, u Unit, kv ...string) Descriptor {
	x := d(kv...)
	x.Limit = &Override{RequestsPerUnit: rpu, Unit: u}
	return x
}

// dneg is a descriptor giving hits back.
func dneg(hits uint64, kv ...string) Descriptor {
	x := dh(hits, kv...)
	x.Negative = true
	return x
}

// ws is an expected status: the code, the limit (rpu < 0: none), the
// remaining and the seconds to reset.
type ws struct {
	code      Code
	rpu       int64
	unit      Unit
	remaining uint32
	reset     int64
	name      string
}

func ok(rpu int64, u Unit, remaining uint32, reset int64) ws {
	return ws{code: CodeOK, rpu: rpu, unit: u, remaining: remaining, reset: reset}
}
func over(rpu int64, u Unit, reset int64) ws {
	return ws{code: CodeOverLimit, rpu: rpu, unit: u, reset: reset}
}

var (
	noLimit   = ws{code: CodeOK, rpu: -1}
	unlimited = ws{code: CodeOK, rpu: -1, remaining: 1<<32 - 1}
)

func (w ws) String() string {
	if w.rpu < 0 {
		return fmt.Sprintf("%v remaining %d (no limit)", codeName(w.code), w.remaining)
	}
	return fmt.Sprintf("%v %d/%s remaining %d reset %ds name %q", codeName(w.code), w.rpu, w.unit, w.remaining, w.reset, w.name)
}

func statusOf(st Status) ws {
	w := ws{code: st.Code, rpu: -1, remaining: st.Remaining, reset: int64(st.ResetIn / time.Second)}
	if st.ResetIn%time.Second != 0 {
		w.reset = -int64(st.ResetIn) // not whole seconds: never equal to an expectation
	}
	if st.Limit != nil {
		w.rpu, w.unit, w.name = int64(st.Limit.RequestsPerUnit), st.Limit.Unit, st.Limit.Name
	}
	return w
}

// call is one ShouldRateLimit and what it must answer.
type call struct {
	at      int64 // Unix seconds to set the clock to first (0: as it is)
	repeat  int   // send it this many times before the checked one
	domain  string
	hits    uint32
	descs   []Descriptor
	overall Code
	want    []ws
	headers []Header
	stats   []stat // counters after the call
}

type stat struct {
	name, key string
	value     float64
}

func st(name, key string, v float64) stat { return stat{name, key, v} }

func (c call) request(domain string) *Request {
	if c.domain != "" {
		domain = c.domain
	}
	return &Request{Domain: domain, Descriptors: c.descs, Hits: c.hits}
}

// run sends the calls and checks each answer.
func run(t *testing.T, s *Server, clk *fakeclock.Clock, domain string, calls []call) {
	t.Helper()
	ctx := context.Background()
	for i, c := range calls {
		if c.at != 0 {
			clk.Set(sec(c.at))
		}
		for range c.repeat {
			if _, err := s.ShouldRateLimit(ctx, c.request(domain)); err != nil {
				t.Fatalf("call %d (repeat): %v", i, err)
			}
		}
		resp, err := s.ShouldRateLimit(ctx, c.request(domain))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if resp.Overall != c.overall {
			t.Errorf("call %d: overall %s, want %s", i, codeName(resp.Overall), codeName(c.overall))
		}
		if len(resp.Statuses) != len(c.descs) {
			t.Fatalf("call %d: %d statuses for %d descriptors", i, len(resp.Statuses), len(c.descs))
		}
		for j, w := range c.want {
			if got := statusOf(resp.Statuses[j]); got != w {
				t.Errorf("call %d, descriptor %d: %v\n\twant %v", i, j, got, w)
			}
		}
		if c.headers != nil && fmt.Sprint(resp.Headers) != fmt.Sprint(c.headers) {
			t.Errorf("call %d: headers %v, want %v", i, resp.Headers, c.headers)
		}
		for _, sv := range c.stats {
			if got := counter(t, s, sv.name, domain, sv.key); got != sv.value {
				t.Errorf("call %d: %s{key=%q} = %v, want %v", i, sv.name, sv.key, got, sv.value)
			}
		}
	}
}

func TestHarnessStatusString(t *testing.T) {
	if s := fmt.Sprint(over(10, Minute, 58)); !strings.Contains(s, "OVER_LIMIT 10/MINUTE") {
		t.Error(s)
	}
}
