// Command proxyload measures reverse proxies side by side on one machine:
// `sluice proxy`, Go's httputil.ReverseProxy alone, and nginx (its Debian
// package and a config file written here) when it is installed, all in
// front of the same upstream, with the same generators, in interleaved
// rounds. Four more targets answer the rejecting load only, to show where
// the floor is: nginx-quiet (nginx without the error.log line it writes
// for every rejection by default), fasthttp-429 (the proxy's server
// library answering a fixed 429 of sluice's size and fields), hertz-429
// (the same answer from an event-loop HTTP framework, CloudWeGo's hertz)
// and gnet-429 (an event-loop server answering the same, parsing nothing
// but the end of each request head); two more answer the admitting load only:
// fasthttp-proxy (the proxy's HTTP library as a bare reverse proxy) and
// hertz-proxy (the same on CloudWeGo's hertz, an event-loop HTTP
// framework):
//
//   - max: closed-loop maximum throughput with every request admitted
//     (wrk, -conns connections), and the proxy's CPU time per 1,000
//     requests (from /proc);
//
//   - reject: the same with the tenant over its rate, so that almost every
//     request is answered 429 by the proxy itself (sluice's token bucket,
//     nginx's limit_req; the bare proxy has no limiter);
//
//   - open: an open-loop load at -rate requests/s (a schedule fixed in
//     advance, latency measured from each request's scheduled time, so a
//     stall counts against the server), p50 and p99 latency, and the
//     latency each proxy adds to the upstream alone. Each round's open
//     measure is cut into -open-slices slices per target, interleaved
//     across the targets, and the quantiles come from every round's
//     latencies pooled: the p99 of one 5 s measure swings between rounds
//     by more than a proxy adds (the upstream alone 1.3 to 2.0 ms in one
//     run), so a median of per-round p99s compared noise.
//
//   - paired: the open-loop load to each proxy again, its requests
//     interleaved one by one with as many sent to the upstream alone at
//     the same rate. A stall of the machine (tens of ms, a few times a
//     minute on a shared VM) then delays the requests of both alike, and
//     the difference of their quantiles is what the proxy adds, where
//     the open measure's difference also holds which stalls fell in
//     whose slice.
//
//     cd bench && go run ./proxyload -rounds 5 -duration 5s
//
// Each process runs alone on loopback ports; the summary gives the median
// round of each measure and the ratios the acceptance of the proxy's
// performance names. wrk (Debian's package) is required; nginx is
// optional.
//
// To profile sluice under the same load, run its role by hand with
// PROXYLOAD_CPUPROFILE naming the file its CPU profile goes to (written
// when it stops on SIGTERM), next to an upstream role, and load it with
// wrk:
//
//	proxyload -role upstream -listen 127.0.0.1:18080 &
//	PROXYLOAD_CPUPROFILE=reject.prof proxyload -role sluice -policy reject \
//	    -listen 127.0.0.1:18081 -upstream 127.0.0.1:18080 &
//	wrk -t2 -c64 -d10s -H 'X-Api-Key: t1' http://127.0.0.1:18081/
//
// or with the open-loop generator alone (it prints its quantiles):
//
//	proxyload -role open -listen 127.0.0.1:18081 -rate 2000 -open-for 10s
//
// For an A/B of two builds or settings in the same interleaved rounds,
// -b-bin (another build of proxyload) or -b-env (extra environment, such
// as GOGC=off) adds a target sluice-b, and -skip leaves targets out.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
	"github.com/valyala/fasthttp"

	"github.com/sluice-go/sluice/internal/sysmon"
	"github.com/sluice-go/sluice/proxy"
)

// The policies sluice runs: every request admitted (a rate far above what
// loopback offers, and a concurrency limit that never binds), or the one
// tenant at 100 requests/s, so that nearly every request is rejected.
const (
	admitPolicy = `version: 1
service: bench
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1e9/s, burst: 1000000000}
  - {name: pool, kind: concurrency, scope: service, limit: 10000}
`
	rejectPolicy = `version: 1
service: bench
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 100/s, burst: 1}
`
)

// nginxConf is nginx as a reverse proxy with upstream keep-alive, and a
// second server with limit_req at the same rate as rejectPolicy. nginx logs
// every request limit_req refuses, a line in error.log at level error
// (limit_req_log_level's default), and sluice logs none by default; the
// third server is the second without that line (logged at info, below the
// log's level), measured as the target nginx-quiet.
const nginxConf = `worker_processes {{workers}};
daemon off;
master_process on;
error_log {{dir}}/error.log warn;
pid {{dir}}/nginx.pid;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {{dir}}/body;
    proxy_temp_path {{dir}}/proxy;
    fastcgi_temp_path {{dir}}/fastcgi;
    uwsgi_temp_path {{dir}}/uwsgi;
    scgi_temp_path {{dir}}/scgi;
    limit_req_zone $http_x_api_key zone=tenants:10m rate=100r/s;
    limit_req_status 429;
    upstream app { server {{upstream}}; keepalive 512; keepalive_requests 1000000; }
    server {
        listen {{admit}};
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $remote_addr;
        }
    }
    server {
        listen {{reject}};
        location / {
            limit_req zone=tenants burst=1 nodelay;
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $remote_addr;
        }
    }
    server {
        listen {{quiet}};
        limit_req_log_level info;
        location / {
            limit_req zone=tenants burst=1 nodelay;
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $remote_addr;
        }
    }
}
`

func main() {
	role := flag.String("role", "", "internal: run one process of the harness (upstream, bare, sluice)")
	listen := flag.String("listen", "", "internal: the role's address")
	upstream := flag.String("upstream", "", "internal: the upstream's address")
	policy := flag.String("policy", "", "internal: sluice's policy (admit or reject)")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 5*time.Second, "length of each measurement")
	conns := flag.Int("conns", 64, "wrk connections")
	threads := flag.Int("threads", 2, "wrk threads")
	only := flag.String("only", "max,reject,open,paired", "measures to run")
	nslices := flag.Int("open-slices", 5, "slices each round's open-loop measure is cut into, interleaved across the targets")
	flag.StringVar(&abEnv, "b-env", "", "also measure sluice-b: sluice started with these extra environment variables (K=V,K=V), for an A/B in the same rounds")
	flag.StringVar(&abBin, "b-bin", "", "also measure sluice-b: this proxyload binary's sluice role (another build), for an A/B in the same rounds")
	flag.IntVar(&openRate, "rate", 2000, "open-loop requests per second")
	flag.DurationVar(&openFor, "open-for", 10*time.Second, "internal: how long -role open runs")
	skip := flag.String("skip", "", "targets left out of every measure (comma-separated names, e.g. go-reverseproxy,sluice-nethttp)")
	flag.BoolVar(&countCalls, "syscalls", false, "also count each target's system calls per request in the max and reject measures (perf stat on syscall tracepoints; needs perf and tracefs)")
	flag.Parse()
	skipped = strings.Split(*skip, ",")
	if *role != "" {
		runRole(*role, *listen, *upstream, *policy)
		return
	}
	if err := run(*rounds, *duration, *conns, *threads, openRate, max(*nslices, 1), strings.Split(*only, ",")); err != nil {
		log.Fatal(err)
	}
}

// The A/B target's settings (flags -b-env and -b-bin), and the targets
// left out of the measures (-skip).
var (
	abEnv, abBin string
	skipped      []string
	openRate     int           // -rate
	openFor      time.Duration // -open-for
	countCalls   bool          // -syscalls
)

// syscallsOf starts counting p's system calls when -syscalls is set; stop
// returns them by family (nil when not counted).
func syscallsOf(p *proc) (stop func() map[string]float64) {
	if !countCalls {
		return func() map[string]float64 { return nil }
	}
	return countSyscalls(p.pids())
}

// runRole is one child process.
func runRole(role, listen, upstream, policy string) {
	switch role {
	case "upstream":
		serveUpstream(listen)
	case "open":
		// The open-loop generator alone, against listen, for a profile
		// or a system-call count of one target under it.
		ls, err := openLoop([]string{listen}, openRate, openFor)
		if err != nil {
			log.Fatal(err)
		}
		l := ls[0]
		slices.Sort(l)
		for _, q := range quantiles {
			fmt.Printf("%s %.3f ms  ", q.name, float64(l[int(q.q*float64(len(l)-1))].Microseconds())/1000)
		}
		fmt.Println()
	case "bare":
		u, _ := url.Parse("http://" + upstream)
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 4096, 4096
		rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
			Transport: t, BufferPool: &bufPool{}}
		rp.ErrorLog = log.New(io.Discard, "", 0) // wrk cuts requests at its end
		log.Fatal((&http.Server{Addr: listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe())
	case "sluice", "sluice-nethttp":
		// As `sluice proxy` does: started again with the runtime's monitor
		// kept awake (sysmon.Reexec).
		if err := sysmon.Reexec(); err != nil {
			log.Printf("sysmon: %v", err)
		}
		if f := os.Getenv("PROXYLOAD_CPUPROFILE"); f != "" {
			out, err := os.Create(f)
			if err != nil {
				log.Fatal(err)
			}
			_ = pprof.StartCPUProfile(out)
			defer pprof.StopCPUProfile()
		}
		u, _ := url.Parse("http://" + upstream)
		p := admitPolicy
		if policy == "reject" {
			p = rejectPolicy
		}
		s, err := proxy.New(proxy.Options{Config: "bench.yaml", ConfigData: []byte(p), Upstream: u, Listen: listen,
			Admin: "127.0.0.1:0", AdminToken: "bench", NetHTTP: role == "sluice-nethttp",
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer cancel()
		if err := s.Run(ctx); err != nil {
			log.Fatal(err)
		}
	case "hertz":
		// A reverse proxy on an event-loop HTTP framework (CloudWeGo's
		// hertz, on its netpoll event loop: the poller reads a socket only
		// when epoll says it is readable), for the admitted path only: the
		// request sent on to the upstream over hertz's client (kept-alive
		// connections, also on netpoll) with X-Forwarded-For set, nothing
		// decided. What the proxy's data path could reach on a well-kept
		// event-loop library.
		hertzProxy(listen, upstream)
	case "fasthttp-proxy":
		// The proxy's own HTTP library as a bare reverse proxy: a
		// fasthttp server handing each request to a fasthttp.HostClient
		// (kept-alive connections), X-Forwarded-For set, nothing decided,
		// no other header touched: what sluice's data path costs beyond its
		// library.
		hc := &fasthttp.HostClient{Addr: upstream, MaxConns: 4096}
		h := func(ctx *fasthttp.RequestCtx) {
			ctx.Request.Header.Set("X-Forwarded-For", ctx.RemoteIP().String())
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Response.Reset()
				ctx.SetStatusCode(http.StatusBadGateway)
			}
		}
		log.Fatal((&fasthttp.Server{Handler: h, NoDefaultServerHeader: true}).ListenAndServe(listen))
	case "floor":
		// The floor of the proxy's server library: fasthttp answering every
		// request with a fixed 429 of the size and fields of sluice's, with
		// nothing decided.
		body := []byte(floorBody)
		h := func(ctx *fasthttp.RequestCtx) {
			ctx.Response.Header.Set("Retry-After", "1")
			ctx.Response.Header.Set("Ratelimit-Policy", `"request-rate";q=100;w=1;sluice-burst=1`)
			ctx.Response.Header.Set("Ratelimit", `"request-rate";r=0;t=1`)
			ctx.Response.Header.Set("X-Request-Id", "0000000-1")
			ctx.Response.Header.Set("Cache-Control", "no-store")
			ctx.SetContentType("application/json")
			ctx.SetStatusCode(429)
			ctx.SetBody(body)
		}
		log.Fatal((&fasthttp.Server{Handler: h, NoDefaultServerHeader: true}).ListenAndServe(listen))
	case "hertz-floor":
		// The same floor on an event-loop HTTP framework (hertz on
		// netpoll): a real HTTP/1.1 server reading a socket only when epoll
		// says it is readable, answering the same fixed 429.
		hertzFloor(listen)
	case "gnet-floor":
		// The floor of an event-loop server: gnet (no goroutine per
		// connection) answering every request head with the same fixed 429
		// as the fasthttp floor, with nothing parsed but the end of the head
		// (wrk sends GETs without bodies). Not an HTTP server: the ceiling a
		// proxy on an event loop could approach.
		log.Fatal(gnet.Run(&gnetFloor{resp: fixed429()}, "tcp://"+listen, gnet.WithMulticore(true), gnet.WithLogLevel(logging.ErrorLevel)))
	default:
		log.Fatalf("unknown role %q", role)
	}
}

// floorBody is the floors' 429 body: sluice's rejection of the rejecting
// policy, byte for byte but for its request id.
const floorBody = `{"error":{"reason":"policy_rate","scope":"tenant","gate":"request-rate","retryable":true,"effect_possible":false,"retry_after":1,"request_id":"0000000-1","message":"request-rate: rate limit exceeded (100 requests per second per tenant, in bursts of up to 1); retry after 1s"}}`

// fixed429 is the fasthttp floor's answer, as bytes on the wire.
func fixed429() []byte {
	body := floorBody
	return []byte("HTTP/1.1 429 Too Many Requests\r\n" +
		"Date: " + time.Now().UTC().Format(http.TimeFormat) + "\r\n" +
		"Content-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		"Retry-After: 1\r\n" +
		`Ratelimit-Policy: "request-rate";q=100;w=1;sluice-burst=1` + "\r\n" +
		`Ratelimit: "request-rate";r=0;t=1` + "\r\n" +
		"X-Request-Id: 0000000-1\r\n" +
		"Cache-Control: no-store\r\n\r\n" + body)
}

// gnetFloor answers each complete request head with resp.
type gnetFloor struct {
	gnet.BuiltinEventEngine
	resp []byte
}

func (g *gnetFloor) OnTraffic(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	done, n := 0, 0
	for {
		i := bytes.Index(buf[done:], []byte("\r\n\r\n"))
		if i < 0 {
			break
		}
		done += i + 4
		n++
	}
	_, _ = c.Discard(done)
	for range n {
		_, _ = c.Write(g.resp)
	}
	return gnet.None
}

type bufPool struct{ p sync.Pool }

func (b *bufPool) Get() []byte {
	if v := b.p.Get(); v != nil {
		return *v.(*[]byte)
	}
	return make([]byte, 32<<10)
}

func (b *bufPool) Put(x []byte) { b.p.Put(&x) }

// serveUpstream is the upstream every proxy forwards to: HTTP/1.1 with
// keep-alive, a 2-byte body for every request, as little work as an HTTP
// server can do, so that what is measured is the proxies.
func serveUpstream(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			br := bufio.NewReaderSize(c, 16<<10)
			bw := bufio.NewWriterSize(c, 16<<10)
			for {
				cl := 0
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 {
						break
					}
					if k, v, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(k), "content-length") {
						cl, _ = strconv.Atoi(strings.TrimSpace(string(v)))
					}
				}
				if cl > 0 {
					io.CopyN(io.Discard, br, int64(cl))
				}
				bw.Write(resp)
				if br.Buffered() == 0 { // answer a pipelined batch at once
					if bw.Flush() != nil {
						return
					}
				}
			}
		}()
	}
}

// proc is a child process (nginx: its master; the workers are its
// children).
type proc struct {
	name string
	cmd  *exec.Cmd
}

// cpu returns the CPU time the process and its children (nginx' workers)
// have used so far.
func (p *proc) cpu() time.Duration {
	var total time.Duration
	for _, pid := range p.pids() {
		total += cpuTime(pid)
	}
	return total
}

func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// cpuTime is utime + stime of pid (clock ticks of 10 ms).
func cpuTime(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

func ppid(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func start(name string, args ...string) (*proc, error) {
	return startEnv(name, nil, args...)
}

// startEnv is start with env added to the harness's own environment.
func startEnv(name string, env []string, args ...string) (*proc, error) {
	cmd := exec.Command(args[0], args[1:]...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &proc{name: name, cmd: cmd}, nil
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func waitUp(addr string) error {
	for range 200 {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return errors.New(addr + " did not come up")
}

// target is one proxy under test, on its admitted and rejecting ports.
type target struct {
	name           string
	admit, reject  string // addresses ("" reject: no limiter)
	admitP, rejecP *proc
}

func run(rounds int, d time.Duration, conns, threads, rate, openSlices int, measures []string) error {
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		return errors.New("wrk not installed (apt-get install wrk)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	upAddr := freePort()
	up, err := start("upstream", self, "-role", "upstream", "-listen", upAddr)
	if err != nil {
		return err
	}
	defer up.stop()
	if err := waitUp(upAddr); err != nil {
		return err
	}
	var targets []*target
	direct := &target{name: "upstream", admit: upAddr, admitP: up}
	targets = append(targets, direct)
	if ng, err := exec.LookPath("nginx"); err == nil {
		t, quiet, dir, err := startNginx(ng, upAddr)
		if dir != "" {
			defer os.RemoveAll(dir) // after nginx stops: its error.log grows by ~700 MB a run
		}
		if err != nil {
			return err
		}
		defer t.admitP.stop()
		targets = append(targets, t, quiet)
	} else {
		fmt.Fprintln(os.Stderr, "nginx not installed: measuring without it (apt-get install nginx)")
	}
	bare := &target{name: "go-reverseproxy", admit: freePort()}
	if bare.admitP, err = start("bare", self, "-role", "bare", "-listen", bare.admit, "-upstream", upAddr); err != nil {
		return err
	}
	defer bare.admitP.stop()
	targets = append(targets, bare)
	fp := &target{name: "fasthttp-proxy", admit: freePort()}
	if fp.admitP, err = start("fasthttp-proxy", self, "-role", "fasthttp-proxy", "-listen", fp.admit, "-upstream", upAddr); err != nil {
		return err
	}
	defer fp.admitP.stop()
	targets = append(targets, fp)
	hz := &target{name: "hertz-proxy", admit: freePort()}
	if hz.admitP, err = start("hertz", self, "-role", "hertz", "-listen", hz.admit, "-upstream", upAddr); err != nil {
		return err
	}
	defer hz.admitP.stop()
	targets = append(targets, hz)
	floor := &target{name: "fasthttp-429", reject: freePort()}
	if floor.rejecP, err = start("floor", self, "-role", "floor", "-listen", floor.reject); err != nil {
		return err
	}
	defer floor.rejecP.stop()
	targets = append(targets, floor)
	hfloor := &target{name: "hertz-429", reject: freePort()}
	if hfloor.rejecP, err = start("hertz-floor", self, "-role", "hertz-floor", "-listen", hfloor.reject); err != nil {
		return err
	}
	defer hfloor.rejecP.stop()
	targets = append(targets, hfloor)
	gfloor := &target{name: "gnet-429", reject: freePort()}
	if gfloor.rejecP, err = start("gnet-floor", self, "-role", "gnet-floor", "-listen", gfloor.reject); err != nil {
		return err
	}
	defer gfloor.rejecP.stop()
	targets = append(targets, gfloor)
	roles := []string{"sluice", "sluice-nethttp"}
	if abEnv != "" || abBin != "" {
		roles = append(roles, "sluice-b")
	}
	for _, name := range roles {
		role, bin, env := name, self, []string(nil)
		if name == "sluice-b" {
			role = "sluice"
			if abBin != "" {
				bin = abBin
			}
			if abEnv != "" {
				env = strings.Split(abEnv, ",")
			}
		}
		t := &target{name: name, admit: freePort(), reject: freePort()}
		if t.admitP, err = startEnv(name, env, bin, "-role", role, "-listen", t.admit, "-upstream", upAddr, "-policy", "admit"); err != nil {
			return err
		}
		defer t.admitP.stop()
		if t.rejecP, err = startEnv(name, env, bin, "-role", role, "-listen", t.reject, "-upstream", upAddr, "-policy", "reject"); err != nil {
			return err
		}
		defer t.rejecP.stop()
		targets = append(targets, t)
	}
	for _, t := range targets {
		for _, a := range []string{t.admit, t.reject} {
			if a != "" {
				if err := waitUp(a); err != nil {
					return err
				}
			}
		}
	}
	res := map[string][]float64{} // measure/target → one value per round
	add := func(k string, v float64) { res[k] = append(res[k], v) }
	lats := map[string][]time.Duration{} // target → open-loop latencies of every round
	for r := range rounds {
		fmt.Fprintf(os.Stderr, "round %d of %d\n", r+1, rounds)
		for _, t := range targets {
			if slices.Contains(skipped, t.name) {
				continue
			}
			if slices.Contains(measures, "max") && t.admit != "" {
				p := t.admitP
				c0 := p.cpu()
				stop := syscallsOf(p)
				rps, n, non2xx, err := runWrk(wrk, t.admit, d, conns, threads)
				if err != nil {
					return err
				}
				cpu := p.cpu() - c0
				for fam, calls := range stop() {
					add("sys-"+fam+"/max/"+t.name, calls/float64(n))
				}
				add("max/"+t.name, rps)
				if t != direct {
					add("cpu/"+t.name, float64(cpu.Milliseconds())*1000/float64(n))
				}
				if non2xx > 0 {
					fmt.Fprintf(os.Stderr, "  %s: %d answers not 2xx with every request admitted\n", t.name, non2xx)
				}
			}
			if slices.Contains(measures, "reject") && t.reject != "" {
				p := t.rejecP
				c0 := p.cpu()
				stop := syscallsOf(p)
				rps, n, non2xx, err := runWrk(wrk, t.reject, d, conns, threads)
				if err != nil {
					return err
				}
				cpu := p.cpu() - c0
				for fam, calls := range stop() {
					add("sys-"+fam+"/reject/"+t.name, calls/float64(n))
				}
				add("reject/"+t.name, rps)
				add("rejectcpu/"+t.name, float64(cpu.Milliseconds())*1000/float64(n))
				add("rejected/"+t.name, float64(non2xx)/float64(n))
			}
		}
		// The open-loop measure in short slices, each round's targets in
		// a rotating order: every target's latencies come from the same
		// minutes of the machine, pooled over the rounds (a p99 of one
		// slice swings by more than a proxy adds).
		if slices.Contains(measures, "open") {
			for k := range openSlices {
				for i := range targets {
					t := targets[(i+k+r)%len(targets)]
					if t.admit == "" || slices.Contains(skipped, t.name) {
						continue
					}
					ls, err := openLoop([]string{t.admit}, rate, d/time.Duration(openSlices))
					if err != nil {
						return err
					}
					l := ls[0]
					lats[t.name] = append(lats[t.name], l...)
					// Each slice's own p99, for the median over slices: a
					// stall of the machine (tens of ms, a few times a run)
					// lands in one target's slice and moves its pooled p99.
					add("slicep99/"+t.name, p99of(l))
				}
			}
		}
		// The same load interleaved request by request with as much to the
		// upstream alone: a stall of the machine delays both alike, so the
		// difference of their quantiles is what the proxy adds.
		if slices.Contains(measures, "paired") {
			for k := range openSlices {
				for i := range targets {
					t := targets[(i+k+r)%len(targets)]
					if t == direct || t.admit == "" || slices.Contains(skipped, t.name) {
						continue
					}
					ls, err := openLoop([]string{direct.admit, t.admit}, rate, d/time.Duration(openSlices))
					if err != nil {
						return err
					}
					lats["beside/"+t.name] = append(lats["beside/"+t.name], ls[0]...)
					lats["paired/"+t.name] = append(lats["paired/"+t.name], ls[1]...)
					add("pairslice/"+t.name, p99of(ls[1])-p99of(ls[0]))
				}
			}
		}
	}
	for name, l := range lats {
		slices.Sort(l)
		ms := func(q float64) float64 { return float64(l[int(q*float64(len(l)-1))].Microseconds()) / 1000 }
		for _, q := range quantiles {
			add(fmt.Sprintf("q%g/%s", q.q, name), ms(q.q))
		}
		add("p50/"+name, ms(0.50))
		add("p99/"+name, ms(0.99))
	}
	report(res, targets)
	return nil
}

func startNginx(bin, upAddr string) (t, quiet *target, dir string, err error) {
	dir, err = os.MkdirTemp("", "proxyload-nginx-")
	if err != nil {
		return nil, nil, "", err
	}
	t = &target{name: "nginx", admit: freePort(), reject: freePort()}
	quiet = &target{name: "nginx-quiet", reject: freePort()}
	conf := strings.NewReplacer("{{dir}}", dir, "{{upstream}}", upAddr, "{{admit}}", t.admit, "{{reject}}", t.reject,
		"{{quiet}}", quiet.reject, "{{workers}}", strconv.Itoa(2)).Replace(nginxConf)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, nil, dir, err
	}
	p, err := start("nginx", bin, "-c", path, "-p", dir, "-e", filepath.Join(dir, "error.log"))
	if err != nil {
		return nil, nil, dir, err
	}
	t.admitP, t.rejecP, quiet.rejecP = p, p, p
	return t, quiet, dir, nil
}

var (
	wrkRPS    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkTotal  = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xx = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// runWrk runs wrk against addr and returns requests/s, the requests sent
// and how many were answered other than 2xx or 3xx.
func runWrk(wrk, addr string, d time.Duration, conns, threads int) (rps float64, n, non2xx int64, err error) {
	out, err := exec.Command(wrk, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns), "-d", strconv.Itoa(int(d.Seconds()))+"s",
		"-H", "X-Api-Key: tenant-1", "http://"+addr+"/v1/items/42").CombinedOutput()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	m := wrkRPS.FindSubmatch(out)
	t := wrkTotal.FindSubmatch(out)
	if m == nil || t == nil {
		return 0, 0, 0, fmt.Errorf("wrk: unexpected output\n%s", out)
	}
	rps, _ = strconv.ParseFloat(string(m[1]), 64)
	n, _ = strconv.ParseInt(string(t[1]), 10, 64)
	if x := wrkNon2xx.FindSubmatch(out); x != nil {
		non2xx, _ = strconv.ParseInt(string(x[1]), 10, 64)
	}
	return rps, n, non2xx, nil
}

// openLoop sends rate requests a second to addr for d, each at its
// scheduled time on one of a pool of keep-alive connections (a new one
// when all are busy), and returns every request's latency, from its
// scheduled time to its whole answer.
//
// One goroutine, on a thread of its own, keeps the schedule (newPacer)
// and writes each request itself; each connection has a goroutine that
// waits in the read of its next answer, so that neither sending nor
// receiving waits for a goroutine to be scheduled. Each call starts with
// no connection: a pool kept across one target's slices, idle while the
// other targets run, measured a p99 of 3 to 6 ms for every target against
// 1.3 to 2.3 ms, swinging between runs by more than any proxy adds.
// openLoop runs an open-loop schedule of rate requests/s to each of addrs
// for d, the requests of one address interleaved with the others' one by
// one (request i goes to addrs[i%len(addrs)]), and returns each address's
// latencies, measured from the scheduled times.
func openLoop(addrs []string, rate int, d time.Duration) ([][]time.Duration, error) {
	k := len(addrs)
	n := int(d.Seconds()*float64(rate)) * k
	interval := time.Second / time.Duration(rate*k)
	lat := make([]time.Duration, n)
	req := []byte("GET /v1/items/42 HTTP/1.1\r\nHost: bench\r\nX-Api-Key: tenant-1\r\n\r\n")
	idle := make([]chan *conn, k)
	for a := range idle {
		idle[a] = make(chan *conn, 4096)
	}
	var readers sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	var all []*conn
	var pending sync.WaitGroup // requests written and not yet answered
	paced := make(chan struct{})
	go func() {
		defer close(paced)
		sleepUntil := newPacer()
		start := time.Now().Add(10 * time.Millisecond)
		for i := range n {
			at := start.Add(time.Duration(i) * interval)
			sleepUntil(at)
			a := i % k
			var c *conn
			select {
			case c = <-idle[a]:
			default:
				nc, err := net.Dial("tcp", addrs[a])
				if err != nil {
					fail(err)
					return
				}
				c = &conn{c: nc, br: bufio.NewReader(nc), jobs: make(chan job, 1)}
				all = append(all, c)
				readers.Add(1)
				go c.answers(lat, idle[a], &readers, &pending, fail)
			}
			pending.Add(1)
			c.jobs <- job{i: i, at: at}
			if _, err := c.c.Write(req); err != nil {
				fail(err)
				return
			}
		}
	}()
	<-paced
	// The last answers, then the readers end on their closed connections
	// (a reader with a request still unanswered reports it).
	answered := make(chan struct{})
	go func() { pending.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		fail(errors.New("answers missing 5 s after the last request"))
	}
	for _, c := range all {
		close(c.jobs)
		c.c.Close()
	}
	readers.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	out := make([][]time.Duration, k)
	for i, l := range lat {
		out[i%k] = append(out[i%k], l)
	}
	return out, nil
}

// conn is a keep-alive connection of the open-loop generator, with the
// request it carries (jobs holds at most one: a connection is idle again
// only once its answer is read).
type conn struct {
	c    net.Conn
	br   *bufio.Reader
	jobs chan job
}

// job is one request of the open-loop schedule: its index and its
// scheduled time.
type job struct {
	i  int
	at time.Time
}

// answers reads c's answers, one per job, until c is closed, recording
// each request's latency in lat, marking it done in pending and handing c
// back to idle after each (unless the server closes it).
func (c *conn) answers(lat []time.Duration, idle chan<- *conn, done, pending *sync.WaitGroup, fail func(error)) {
	defer done.Done()
	for {
		// The read waits for the answer (parked in the poller) before the
		// job is taken: the request is written after its job is queued.
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			if _, more := <-c.jobs; more {
				fail(err)
			}
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		j, more := <-c.jobs
		if !more {
			fail(errors.New("an answer with no request"))
			return
		}
		lat[j.i] = time.Since(j.at)
		pending.Done()
		if err != nil {
			fail(fmt.Errorf("answer %d: %w", j.i, err))
			return
		}
		if resp.Close {
			return // the pacer dials another when none is idle
		}
		idle <- c
	}
}

// The open-loop quantiles the report's second table shows.
var quantiles = []struct {
	name string
	q    float64
}{{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"p99.9", 0.999}, {"max", 1}}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// p99of is the p99 of l in ms (l is sorted).
func p99of(l []time.Duration) float64 {
	slices.Sort(l)
	return float64(l[int(0.99*float64(len(l)-1))].Microseconds()) / 1000
}

func report(res map[string][]float64, targets []*target) {
	get := func(k string) float64 { return median(res[k]) }
	fmt.Printf("%-16s %12s %12s %12s %12s %9s %9s %9s %9s\n", "target", "max req/s", "cpu ms/1k", "reject req/s", "rej cpu/1k", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms")
	for _, t := range targets {
		fmt.Printf("%-16s %12.0f %12.1f %12.0f %12.1f %9.3f %9.3f %9.3f %9.3f\n", t.name, get("max/"+t.name), get("cpu/"+t.name),
			get("reject/"+t.name), get("rejectcpu/"+t.name), get("p50/"+t.name), get("p99/"+t.name),
			get("p50/"+t.name)-get("p50/upstream"), get("p99/"+t.name)-get("p99/upstream"))
	}
	if len(res["p50/upstream"]) > 0 {
		fmt.Printf("\nopen loop at the rate, pooled quantiles, ms:\n%-16s", "target")
		for _, q := range quantiles {
			fmt.Printf(" %8s", q.name)
		}
		fmt.Println()
		for _, t := range targets {
			if len(res["p50/"+t.name]) == 0 {
				continue
			}
			fmt.Printf("%-16s", t.name)
			for _, q := range quantiles {
				fmt.Printf(" %8.3f", get(fmt.Sprintf("q%g/%s", q.q, t.name)))
			}
			fmt.Printf("   (median of slices' p99s %.3f)\n", get("slicep99/"+t.name))
		}
		fmt.Println()
	}
	ratio := func(what, a, b string, _ bool) {
		x, y := get(a), get(b)
		if x == 0 || y == 0 {
			return
		}
		fmt.Printf("  %-58s %6.2f\n", what, x/y)
	}
	if len(res["pairslice/sluice"]) > 0 {
		fmt.Printf("open loop interleaved request by request with the upstream alone, pooled, ms:\n%-16s %8s %8s %8s %8s %9s %9s %12s\n",
			"target", "p50", "beside", "p99", "beside", "+p50", "+p99", "+p99 slices")
		for _, t := range targets {
			n := t.name
			if len(res["pairslice/"+n]) == 0 {
				continue
			}
			fmt.Printf("%-16s %8.3f %8.3f %8.3f %8.3f %9.3f %9.3f %12.3f\n", n,
				get("p50/paired/"+n), get("p50/beside/"+n), get("p99/paired/"+n), get("p99/beside/"+n),
				get("p50/paired/"+n)-get("p50/beside/"+n), get("p99/paired/"+n)-get("p99/beside/"+n), get("pairslice/"+n))
		}
		fmt.Println()
	}
	if countCalls {
		fmt.Printf("system calls per request (perf stat), medians of the rounds:\n%-16s", "target")
		for _, m := range []string{"max", "reject"} {
			for _, f := range syscallFamilies {
				fmt.Printf(" %9s", m[:3]+" "+f.name)
			}
		}
		fmt.Println()
		for _, t := range targets {
			fmt.Printf("%-16s", t.name)
			for _, m := range []string{"max", "reject"} {
				for _, f := range syscallFamilies {
					if v := res["sys-"+f.name+"/"+m+"/"+t.name]; len(v) > 0 {
						fmt.Printf(" %9.2f", median(v))
					} else {
						fmt.Printf(" %9s", "-")
					}
				}
			}
			fmt.Println()
		}
		fmt.Println()
	}
	fmt.Println("ratios (medians):")
	ratio("sluice / go-reverseproxy, max throughput all admitted", "max/sluice", "max/go-reverseproxy", false)
	ratio("sluice / nginx, max throughput all admitted", "max/sluice", "max/nginx", false)
	ratio("  sluice's library as a bare proxy (fasthttp) / nginx", "max/fasthttp-proxy", "max/nginx", false)
	ratio("    its CPU per 1k admitted requests / nginx's", "cpu/fasthttp-proxy", "cpu/nginx", false)
	ratio("  an event-loop framework's bare proxy (hertz) / nginx", "max/hertz-proxy", "max/nginx", false)
	ratio("    its CPU per 1k admitted requests / nginx's", "cpu/hertz-proxy", "cpu/nginx", false)
	ratio("    its read calls per admitted request / nginx's", "sys-read/max/hertz-proxy", "sys-read/max/nginx", false)
	ratio("sluice / nginx limit_req, rejected-path throughput", "reject/sluice", "reject/nginx", false)
	ratio("  the same against nginx without its log line per rejection", "reject/sluice", "reject/nginx-quiet", false)
	ratio("sluice / nginx, CPU per 1k admitted requests", "cpu/sluice", "cpu/nginx", false)
	ratio("sluice / nginx, read calls per admitted request", "sys-read/max/sluice", "sys-read/max/nginx", false)
	ratio("sluice / nginx, system calls per admitted request", "sys-all/max/sluice", "sys-all/max/nginx", false)
	ratio("sluice / nginx quiet, read calls per rejected request", "sys-read/reject/sluice", "sys-read/reject/nginx-quiet", false)
	added := func(label, key string) {
		x, y := get(key+"/sluice")-get(key+"/upstream"), get(key+"/nginx")-get(key+"/upstream")
		switch {
		case get(key+"/nginx") == 0 || get(key+"/sluice") == 0:
		case y > 0:
			fmt.Printf("  %-58s %6.2f\n", label, x/y)
		default: // no ratio to a negative or zero added latency
			fmt.Printf("  %-58s   none: nginx's is %.3f ms, sluice's %.3f\n", label, y, x)
		}
	}
	added("sluice / nginx, p99 added latency (open loop)", "p99")
	added("  the same, medians of the 1 s slices' p99s", "slicep99")
	if x, y := get("p99/paired/sluice")-get("p99/beside/sluice"), get("p99/paired/nginx")-get("p99/beside/nginx"); y > 0 {
		fmt.Printf("  %-58s %6.2f\n", "  the same, interleaved with the upstream alone", x/y)
	} else if len(res["pairslice/nginx"]) > 0 {
		fmt.Printf("  %-58s   none: nginx's is %.3f ms, sluice's %.3f\n", "  the same, interleaved with the upstream alone", y, x)
	}
	if x, y := get("pairslice/sluice"), get("pairslice/nginx"); y > 0 {
		fmt.Printf("  %-58s %6.2f\n", "    and the median of its slices", x/y)
	}
	ratio("sluice / its server library's floor (fasthttp, a fixed 429)", "reject/sluice", "reject/fasthttp-429", false)
	ratio("that floor / nginx limit_req", "reject/fasthttp-429", "reject/nginx", false)
	ratio("an event loop's floor (gnet, the same 429) / fasthttp's", "reject/gnet-429", "reject/fasthttp-429", false)
	ratio("the event loop's floor / nginx limit_req without its log line", "reject/gnet-429", "reject/nginx-quiet", false)
	ratio("an event-loop HTTP server's floor (hertz, the same 429) / nginx limit_req without its log line", "reject/hertz-429", "reject/nginx-quiet", false)
	ratio("nginx without / with its log line per rejection", "reject/nginx-quiet", "reject/nginx", false)
	ratio("sluice / sluice over net/http, max throughput all admitted", "max/sluice", "max/sluice-nethttp", false)
	ratio("sluice / sluice over net/http, rejected-path throughput", "reject/sluice", "reject/sluice-nethttp", false)
	if res["max/sluice-b"] != nil || res["p99/sluice-b"] != nil || res["reject/sluice-b"] != nil {
		ratio("A/B: sluice-b / sluice, max throughput all admitted", "max/sluice-b", "max/sluice", false)
		ratio("A/B: sluice-b / sluice, CPU per 1k admitted", "cpu/sluice-b", "cpu/sluice", false)
		ratio("A/B: sluice-b / sluice, rejected-path throughput", "reject/sluice-b", "reject/sluice", false)
		ratio("A/B: sluice-b / sluice, CPU per 1k rejected", "rejectcpu/sluice-b", "rejectcpu/sluice", false)
		x, y := get("p99/sluice-b")-get("p99/upstream"), get("p99/sluice")-get("p99/upstream")
		if y > 0 {
			fmt.Printf("  %-58s %6.2f\n", "A/B: sluice-b / sluice, p99 added latency (open loop)", x/y)
		}
		if y := get("p99/nginx") - get("p99/upstream"); y > 0 {
			fmt.Printf("  %-58s %6.2f\n", "sluice-b / nginx, p99 added latency (open loop)", x/y)
		}
	}
	for _, t := range targets {
		if v := res["rejected/"+t.name]; len(v) > 0 {
			fmt.Printf("  share answered 429 by %s: %.3f\n", t.name, median(v))
		}
	}
}
