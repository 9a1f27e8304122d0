package rls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bytes that are not UTF-8 in a domain, a key or a value are refused with
// ErrInvalid (as gRPC's proto3 decoding refuses them), never a panic: the
// metrics' labels are built from them, and Prometheus panics on a label
// value that is not UTF-8.
func TestInvalidUTF8Refused(t *testing.T) {
	cfg := mustParse(t, conformanceConfig+"  - {key: detailed, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 5}}\n")
	for name, r := range map[string]*Request{
		"unknown_domain": {Domain: "\xff", Descriptors: []Descriptor{d("k", "v")}},
		"override_value": {Domain: "edge", Descriptors: []Descriptor{dover(5, Minute, "k", "\xff\xfe")}},
		"override_key":   {Domain: "edge", Descriptors: []Descriptor{dover(5, Minute, "k\xc3", "v")}},
		"detailed_value": {Domain: "edge", Descriptors: []Descriptor{d("detailed", "a\x80b")}},
	} {
		t.Run(name, func(t *testing.T) {
			s, clk := backend{name: "memory"}.server(t, cfg, Options{})
			clk.Set(sec(1200))
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				_, err = s.ShouldRateLimit(context.Background(), r)
			}()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
				t.Errorf("%v, want ErrInvalid naming UTF-8", err)
			}
			// and the Server still answers (a panic once left the metrics' mutex locked)
			done := make(chan error, 1)
			go func() {
				_, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "nowhere", Descriptors: []Descriptor{d("k", "v")}})
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the Server hangs after the call")
			}
		})
	}
}

// A permit whose release never comes is freed after ConcurrencyTTL even
// when every slot of the key is held by such permits and no other key is
// taken: the expired permits are swept before the take, not only after an
// admitted one (on memory, a key whose releases were lost stayed full
// forever).
func TestConcurrencyTTLLoneKey(t *testing.T) {
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, mustParse(t, extConfig), Options{ConcurrencyTTL: 10 * time.Second})
			run(t, s, clk, "ext", []call{
				{at: 1000, repeat: 1, descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
				{at: 1005, descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
				{at: 1020, descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
			})
		})
	}
}

// A reload that changes a concurrency rule's limit keeps the permits in
// flight: raising 2 → 3 with 2 held admits one more, lowering to 1 admits
// none until releases bring the count under it, and the releases of the
// permits taken before the reload free them (they are not unmatched).
func TestConcurrencyLimitReloadKeepsPermits(t *testing.T) {
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, mustParse(t, extConfig), Options{})
			clk.Set(sec(1000))
			call := func(neg bool) Code {
				t.Helper()
				x := dh(1, "upload", "x")
				x.Negative = neg
				r, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "ext", Descriptors: []Descriptor{x}})
				if err != nil {
					t.Fatal(err)
				}
				return r.Overall
			}
			set := func(limit int) {
				t.Helper()
				if err := s.SetConfig(mustParse(t, strings.Replace(extConfig, "limit: 2}", fmt.Sprintf("limit: %d}", limit), 1))); err != nil {
					t.Fatal(err)
				}
			}
			call(false)
			call(false) // 2 held, limit 2
			set(3)
			admitted := 0
			for range 4 {
				if call(false) == CodeOK {
					admitted++
				}
			}
			if admitted != 1 {
				t.Errorf("limit 2 → 3 with 2 held: %d more admitted, want 1", admitted)
			}
			set(1) // 3 held, limit 1
			if call(false) != CodeOverLimit {
				t.Error("limit 3 → 1 with 3 held: a take admitted")
			}
			call(true)
			call(true) // 1 held
			if call(false) != CodeOverLimit {
				t.Error("1 held, limit 1: a take admitted")
			}
			call(true) // 0 held
			if call(false) != CodeOK {
				t.Error("0 held, limit 1: the take refused")
			}
			if got := counter(t, s, "sluice_rls_release_unmatched_total"); got != 0 {
				t.Errorf("%v releases unmatched, want 0", got)
			}
		})
	}
}

// A clock step back is not a lock-out for the step's length (limit's
// ClockTolerance contract), on memory too once its table has dropped keys:
// the clock runs a day ahead while a flood of distinct keys fills the
// table (sweeps and evictions), then steps back. A key's windows then
// roll minute by minute as before; they stuck at the day-ahead instant of
// the last drop, the key refused for the whole day.
func TestClockStepBackAfterDrops(t *testing.T) {
	s, clk := backend{name: "memory"}.server(t, mustParse(t, conformanceConfig), Options{MaxKeys: 64})
	ctx := context.Background()
	clk.Set(sec(1200 + 86400))
	for i := range 2000 {
		if _, err := s.ShouldRateLimit(ctx, &Request{Domain: "edge", Descriptors: []Descriptor{d("tenant", fmt.Sprint("flood", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	for m := range int64(3) {
		clk.Set(sec(1200 + 60*m))
		admitted := 0
		for range 12 {
			r, err := s.ShouldRateLimit(ctx, &Request{Domain: "edge", Descriptors: []Descriptor{d("tenant", "victim")}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Overall == CodeOK {
				admitted++
			}
		}
		if admitted != 10 {
			t.Errorf("minute %d after the step back: %d of 12 admitted, want 10 (10/minute)", m, admitted)
		}
	}
}

// Load reads regular files only, as it skips subfolders: a symlink to a
// folder is skipped (it failed the whole load with "is a directory"), and
// a named pipe is skipped (reading it blocked Load, and so a reload, until
// something wrote to it).
func TestLoadSkipsNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Skip("no named pipes:", err)
	}
	done := make(chan error, 1)
	go func() {
		cfg, err := Load(dir)
		if err == nil && fmt.Sprint(cfg.Domains()) != "[a]" {
			err = fmt.Errorf("domains %v, want [a]", cfg.Domains())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(5 * time.Second):
		// unblock the reader so that the test ends
		if f, err := os.OpenFile(filepath.Join(dir, "pipe.yaml"), os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatal("Load blocked reading a named pipe")
	}
}

// A descriptor whose counter key is longer than the memory table keeps
// exactly (a slot holds 16 bits of length: beyond 65535 bytes the key was
// never found again, every call a fresh counter, the limit never applied)
// is counted like any other: 8 entries of 4096-byte keys and values, in
// bounds, over a limit of 1.
func TestLongDescriptorCounted(t *testing.T) {
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, mustParse(t, conformanceConfig), Options{})
			clk.Set(sec(1200))
			big := strings.Repeat("v", MaxNameBytes)
			es := make([]Entry, 8)
			for j := range es {
				es[j] = Entry{Key: big, Value: big}
			}
			many := make([]Entry, 16) // a tree with one rule, values from headers
			for j := range many {
				many[j] = Entry{Key: "long", Value: big}
			}
			cfg := "domain: deep\ndescriptors:\n"
			ind := ""
			for j := range many {
				cfg += ind + "  - key: long\n"
				if j == len(many)-1 {
					cfg += ind + "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
				} else {
					cfg += ind + "    descriptors:\n"
				}
				ind += "    "
			}
			joined, err := Join(mustParse(t, conformanceConfig), mustParse(t, cfg))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SetConfig(joined); err != nil {
				t.Fatal(err)
			}
			for name, r := range map[string]*Request{
				"override": {Domain: "edge", Descriptors: []Descriptor{{Entries: es, Limit: &Override{RequestsPerUnit: 1, Unit: Minute}}}},
				"rule":     {Domain: "deep", Descriptors: []Descriptor{{Entries: many}}},
			} {
				var got []Code
				for range 3 {
					resp, err := s.ShouldRateLimit(context.Background(), r)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, resp.Overall)
				}
				if fmt.Sprint(got) != fmt.Sprint([]Code{CodeOK, CodeOverLimit, CodeOverLimit}) {
					t.Errorf("%s: %v, want [OK OVER_LIMIT OVER_LIMIT] (limit 1)", name, got)
				}
			}
		})
	}
}

// The key label is bounded in bytes as the label pairs are in number: a
// descriptor whose statistics key is longer than MaxMetricKeyBytes counts
// under OtherKey. (An override's key is every entry, up to 32 of 4 KiB
// keys and values: 1000 such series made each /metrics scrape 8 × 1000 ×
// 256 KiB, 2 GB of text.)
func TestMetricKeyLabelBounded(t *testing.T) {
	s, clk := backend{name: "memory"}.server(t, mustParse(t, conformanceConfig), Options{})
	clk.Set(sec(1200))
	big := strings.Repeat("v", MaxNameBytes)
	for i := range 5 {
		es := make([]Entry, 8)
		for j := range es {
			es[j] = Entry{Key: fmt.Sprint(i, j), Value: big}
		}
		if _, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "edge", Descriptors: []Descriptor{{Entries: es, Limit: &Override{RequestsPerUnit: 9, Unit: Minute}}}}); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := s.Registry().(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if len(l.GetValue()) > MaxMetricKeyBytes {
					t.Fatalf("%s{%s} has a label of %d bytes, more than %d", mf.GetName(), l.GetName(), len(l.GetValue()), MaxMetricKeyBytes)
				}
			}
		}
	}
	if got := counter(t, s, mHits, "edge", OtherKey); got != 5 {
		t.Errorf("hits under %s: %v, want 5", OtherKey, got)
	}
}

// A call whose context has ended before it is decided counts nothing, on
// every backend: the memory store counted its hits (three such calls used
// up a limit of 2 a minute) while Redis, which refuses to send a call of an
// ended context, counted none.
func TestEndedContextCountsNothing(t *testing.T) {
	cfg := mustParse(t, conformanceConfig)
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, cfg, Options{})
			clk.Set(sec(1200))
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			req := &Request{Domain: "edge", Descriptors: []Descriptor{d("path", "/a")}}
			for range 3 {
				if _, err := s.ShouldRateLimit(ended, req); !errors.Is(err, context.Canceled) {
					t.Fatalf("an ended call: %v", err)
				}
			}
			resp, err := s.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.Overall != CodeOK {
				t.Fatalf("the first live call after three ended ones: %+v, %v", resp, err)
			}
		})
	}
}
