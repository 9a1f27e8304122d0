package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// The demos that judge a whole run (the capacity matrix, the long
// incident) run the upstream and the proxy in processes of their own,
// started from the sluice binary (Exe): the load generator in this process
// then competes with them for the machine as a separate client would,
// instead of sharing one Go scheduler with the server it measures (which,
// on two cores, fell behind at 10x in 5 of 13 runs of the sweep and took
// the proxy's goodput down with it).

// child is a process of the sluice binary on loopback.
type child struct {
	cmd  *exec.Cmd
	addr string // where it serves
	done chan struct{}
}

// freePorts returns n different loopback addresses nothing listens on
// now (all held open until all are chosen: one closed before the next is
// asked for may come back twice).
func freePorts(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// spawn starts exe with args, its output to log, and waits until addr
// accepts connections.
func spawn(ctx context.Context, exe, addr string, log io.Writer, args ...string) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() { cmd.Wait(); close(c.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			conn.Close()
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("%s %v: exited before serving on %s", filepath.Base(exe), args, addr)
		case <-ctx.Done():
			c.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("%s %v: not serving on %s after 15 s", filepath.Base(exe), args, addr)
		}
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 5 s.
func (c *child) stop() {
	if c == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// stack is an upstream process, and a proxy process in front of it unless
// the run is without admission.
type stack struct {
	up, proxy *child
	target    string // where the load goes
	admin     string // the proxy's admin address
}

// stackOptions describes a stack.
type stackOptions struct {
	Exe        string
	Workers    int
	Service    time.Duration // constant service time; 0: the routes-api mix
	PolicyFile string        // "": no proxy (the run without admission)
	Log        io.Writer
	// AccessLog, when set, receives the proxy's output instead of Log, with
	// an access log line for every decision (JSON, every rejection too):
	// a recording sluice whatif reads.
	AccessLog io.Writer
}

// startStack starts the upstream and, with a policy, the proxy.
func startStack(ctx context.Context, o stackOptions) (*stack, error) {
	addrs, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	upAddr, pAddr, aAddr := addrs[0], addrs[1], addrs[2]
	args := []string{"demo", "upstream", "--listen", upAddr, "--workers", strconv.Itoa(o.Workers)}
	if o.Service > 0 {
		args = append(args, "--service", o.Service.String())
	}
	up, err := spawn(ctx, o.Exe, upAddr, o.Log, args...)
	if err != nil {
		return nil, err
	}
	s := &stack{up: up, target: "http://" + upAddr}
	if o.PolicyFile == "" {
		return s, nil
	}
	plog, pargs := o.Log, []string{"--log-level", "error"}
	if o.AccessLog != nil {
		plog, pargs = o.AccessLog, []string{"--log-level", "info", "--log-format", "json", "--access-log", "--access-log-rejects", "-1"}
	}
	s.proxy, err = spawn(ctx, o.Exe, pAddr, plog, append([]string{"proxy", "--config", o.PolicyFile, "--upstream", "http://" + upAddr,
		"--listen", pAddr, "--admin", aAddr, "--admin-token", adminToken}, pargs...)...)
	if err != nil {
		up.stop()
		return nil, err
	}
	s.target, s.admin = "http://"+pAddr, aAddr
	return s, nil
}

const adminToken = "demo"

// slowdownPath is the upstream role's control of its service times.
const slowdownPath = "/_demo/slowdown"

// slowdown sets the upstream's service-time multiplier.
func (s *stack) slowdown(f float64) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post("http://"+s.up.addr+slowdownPath+"?factor="+strconv.FormatFloat(f, 'g', -1, 64), "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upstream slowdown: %s", resp.Status)
	}
	return nil
}

// stop stops the proxy, then the upstream.
func (s *stack) stop() {
	s.proxy.stop()
	s.up.stop()
}

// limit reads the proxy's first adaptive limit from its admin API (0: none
// or unreadable).
func (s *stack) limit() int {
	if s.admin == "" {
		return 0
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.admin+"/v1/gates", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	c := http.Client{Timeout: time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var gates []struct {
		Kind  string `json:"kind"`
		State struct {
			Limit int `json:"limit"`
			Inner struct {
				Limit int `json:"limit"`
			} `json:"inner"`
		} `json:"state"`
	}
	if json.NewDecoder(resp.Body).Decode(&gates) != nil {
		return 0
	}
	for _, g := range gates {
		if g.Kind == "adaptive_concurrency" {
			return max(g.State.Limit, g.State.Inner.Limit)
		}
	}
	return 0
}

// ServeUpstream serves the demo upstream with workers workers on listen
// until ctx ends: the routes-api model, or every request taking exactly
// service when it is set (the upstream role of sluice demo's multi-process
// runs).
func ServeUpstream(ctx context.Context, listen string, workers int, service time.Duration) error {
	up := NewUpstream(workers)
	if service > 0 {
		up.SetConstantServiceTime(service)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		up.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", up)
	// The run's control: POST /_demo/slowdown?factor=4 multiplies the
	// service times from now on (a capacity step).
	mux.HandleFunc("POST "+slowdownPath, func(w http.ResponseWriter, r *http.Request) {
		f, err := strconv.ParseFloat(r.URL.Query().Get("factor"), 64)
		if err != nil || !(f > 0) || f > 1000 {
			http.Error(w, "factor: want a number in (0, 1000]", http.StatusBadRequest)
			return
		}
		up.SetSlowdown(f)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		up.Close()
		srv.Close()
	}()
	err = srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// writePolicy writes policy to a file in a new temporary directory and
// returns its path and the directory's removal.
func writePolicy(name string, policy []byte) (string, func(), error) {
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(dir, filepath.Base(name))
	if filepath.Ext(path) != ".yaml" {
		path += ".yaml"
	}
	if err := os.WriteFile(path, policy, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return path, func() { os.RemoveAll(dir) }, nil
}
