package demo

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/proxy"
)

// actAsSluice runs what the multi-process demos ask of the sluice binary
// (sluice proxy, sluice demo upstream), with the flags they pass, until
// SIGTERM; it returns the exit status.
func actAsSluice(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	switch args[0] {
	case "demo": // demo upstream --listen --workers [--service]
		workers := fs.Int("workers", 8, "")
		service := fs.Duration("service", 0, "")
		if len(args) < 2 || args[1] != "upstream" || fs.Parse(args[2:]) != nil {
			return 2
		}
		if err := ServeUpstream(ctx, *listen, *workers, *service); err != nil {
			return 1
		}
		return 0
	default: // proxy --config --upstream --listen --admin --admin-token --log-level [--log-format json --access-log --access-log-rejects -1]
		config := fs.String("config", "", "")
		upstream := fs.String("upstream", "", "")
		admin := fs.String("admin", "", "")
		token := fs.String("admin-token", "", "")
		fs.String("log-level", "", "")
		fs.String("log-format", "", "")
		accessLog := fs.Bool("access-log", false, "")
		fs.Int("access-log-rejects", 1, "")
		if fs.Parse(args[1:]) != nil {
			return 2
		}
		u, err := url.Parse(*upstream)
		if err != nil {
			return 2
		}
		opts := proxy.Options{Config: *config, Upstream: u, Listen: *listen, Admin: *admin, AdminToken: *token,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if *accessLog { // as the recording stack asks: JSON, every rejection
			opts.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
			opts.AccessLog = &httpgate.AccessLog{Logger: opts.Logger, RejectsPerSecond: -1}
		}
		s, err := proxy.New(opts)
		if err != nil {
			return 1
		}
		if s.Run(ctx) != nil {
			return 1
		}
		return 0
	}
}

// The multi-process stack: an upstream and a proxy started as processes
// of the binary, the load from here, the proxy's adaptive limit read from
// its admin API, and both processes gone when it stops. No rates are
// judged here (a busy machine moves them); the demos' runs are in
// BENCHMARKS.md.
func TestMultiProcessStack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and sends real load")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	file, cleanup, err := writePolicy("routes-api.yaml", routesAPI(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx := t.Context()
	st, err := startStack(ctx, stackOptions{Exe: exe, Workers: 2, Service: 20 * time.Millisecond, PolicyFile: file, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	tr := traceStep(st)
	r := openLoop(ctx, st.target, 200, time.Second, 2*time.Second, 500*time.Millisecond, 10, tr)
	limit := st.limit()
	var trace strings.Builder
	tr.write(&trace, &MatrixCell{Workers: 2, ServiceMs: 20, DeadlineMs: 500, Load: 2})
	if err := st.slowdown(2); err != nil {
		t.Error(err)
	}
	st.stop()
	if r.goodput <= 0 || r.offered <= 0 || limit < 1 {
		t.Fatalf("goodput %.0f of %.0f req/s offered, limit %d", r.goodput, r.offered, limit)
	}
	// The trace: a line per second of the 3 s step, what the callers got
	// beside the proxy's gates.
	lines := strings.Split(strings.TrimSpace(trace.String()), "\n")
	if len(lines) < 3 || !strings.Contains(trace.String(), `"gates":[`) || !strings.Contains(lines[0], `"cell":"2w x 20ms, deadline 500ms"`) {
		t.Errorf("trace of %d lines:\n%s", len(lines), trace.String())
	}
	t.Logf("2 workers x 20 ms (100 req/s) at 200 req/s: goodput %.0f req/s, limit %d", r.goodput, limit)
	for _, c := range []*child{st.up, st.proxy} {
		select {
		case <-c.done:
		default:
			t.Errorf("%s still running after stop", c.addr)
		}
	}
}
