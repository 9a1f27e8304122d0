package rlsserve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/logbuf"
)

func TestMain(m *testing.M) {
	// rueidis may leave a delayed call or a topology refresh sleeping for
	// a moment after Close; they end on their own.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// fixedClock is a wall clock that stands still until set.
type fixedClock struct{ ns atomic.Int64 }

func newClock(unixSec int64) *fixedClock {
	c := &fixedClock{}
	c.ns.Store(unixSec * int64(time.Second))
	return c
}

func (c *fixedClock) Now() clock.Instant  { return clock.Instant(c.ns.Load()) }
func (c *fixedClock) Set(unixSec int64)   { c.ns.Store(unixSec * int64(time.Second)) }
func (c *fixedClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// running is a Server started by start, with a gRPC client and the
// addresses of its HTTP and admin listeners.
type running struct {
	*Server
	client   rlspb.RateLimitServiceClient
	conn     *grpc.ClientConn
	httpURL  string
	adminURL string
	log      *logbuf.Buffer
	ticks    chan time.Time
	stop     context.CancelFunc
	done     chan error
	stopped  bool
}

// start runs a Server with opts on loopback ports chosen by the kernel,
// the reload ticker driven by the test; it is stopped when t ends.
func start(t *testing.T, opts Options) *running {
	t.Helper()
	r := &running{log: &logbuf.Buffer{}, ticks: make(chan time.Time)}
	opts.Listen, opts.HTTP, opts.Admin = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	opts.Ticks = r.ticks
	opts.Logger = slog.New(slog.NewTextHandler(r.log, nil))
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.Server = s
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.done = cancel, make(chan error, 1)
	go func() { r.done <- s.Run(ctx) }()
	g, h, a := s.Addrs()
	r.httpURL, r.adminURL = "http://"+h.String(), "http://"+a.String()
	r.conn, err = grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.client = rlspb.NewRateLimitServiceClient(r.conn)
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// shutdown stops the server and waits for Run to return.
func (r *running) shutdown(t *testing.T) {
	t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	r.conn.Close()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30 s after its context ended")
	}
}

// tick drives the configuration watcher once and waits until it has
// taken the tick.
func (r *running) tick() { r.ticks <- time.Now() }

// get returns the status and body of a GET.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of the series of name whose labels contain
// every one of labels (`domain="edge"`), from /metrics; 0 if none.
func metric(t *testing.T, r *running, name string, labels ...string) float64 {
	t.Helper()
	_, body := get(t, r.adminURL+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// writeFile writes data to dir/name atomically (a new file renamed over
// the old), as configuration management does.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// redisServer is a redis-server process on a free loopback port.
type redisServer struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startRedis starts redis-server with extra arguments, or skips t when
// it is not installed (fails it when SLUICE_REQUIRE_REDIS=1, as in CI).
// It is killed when t ends. (The library's internal/redistest cannot be imported from this
// module.)
func startRedis(t *testing.T, extra ...string) *redisServer {
	t.Helper()
	needRedis(t)
	dir := t.TempDir()
	for attempt := 0; attempt < 10; attempt++ {
		port := freePort(t)
		s := &redisServer{addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
		s.cmd = exec.Command("redis-server", append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "",
			"--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, extra...)...)
		s.cmd.Dir = dir
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { s.cmd.Wait(); close(s.exited) }()
		if s.waitUp() {
			t.Cleanup(s.kill)
			return s
		}
		s.kill()
	}
	t.Fatal("redis-server did not start")
	return nil
}

func needRedis(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("SLUICE_REQUIRE_REDIS") == "1" {
				t.Fatalf("%s not found and SLUICE_REQUIRE_REDIS=1", bin)
			}
			t.Skipf("%s not installed", bin)
		}
	}
}

// freePort returns a loopback port free now whose cluster bus port
// (port + 10000) is free too.
func freePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 200; i++ {
		addr := "127.0.0.1:0"
		if i >= 20 {
			addr = "127.0.0.1:" + strconv.Itoa(20000+rand.IntN(35000))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		bus.Close()
		return port
	}
	t.Fatal("no free port pair on 127.0.0.1")
	return 0
}

// startCluster starts three masters joined into a Redis Cluster and
// returns their addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	var addrs []string
	var nodes []*redisServer
	for range 3 {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+strconv.Itoa(len(addrs))+".conf", "--cluster-node-timeout", "2000")
		nodes = append(nodes, s)
		addrs = append(addrs, s.addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	if out, err := exec.Command("redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		for {
			_, port, _ := net.SplitHostPort(s.addr)
			out, _ := exec.Command("redis-cli", "-p", port, "cluster", "info").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the cluster did not become ok")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return addrs
}

func (s *redisServer) waitUp() bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.addr) == nil {
			return true
		}
		select {
		case <-s.exited:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}

// pause freezes the server (SIGSTOP): connections stay open, nothing
// answers.
func (s *redisServer) pause()  { s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *redisServer) resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// kill stops the server at once.
func (s *redisServer) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Kill()
	<-s.exited
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("ping: %q", line)
	}
	return nil
}
