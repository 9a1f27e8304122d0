// Command fdflood floods `sluice proxy` and `sluice serve`, each at the
// file limit it runs with, with idle connections that send nothing (20,000
// and then 40,000 by default: more than either process has descriptors
// for), while a prober opens a fresh connection every 100 ms. It prints,
// per flood, how many connections were opened, how the probes were
// answered during the flood (served, refused, no answer), whether the
// process stayed up, its resident memory at the peak, and how long after
// the flood the prober was served 20 times in a row; and fails if the
// process exited, a probe got an answer other than 200 or 503, or the
// prober was not served within 20 s of the flood's end.
//
// The connections come from child processes (this command run again), so
// that no one process needs more descriptors than its own limit, each
// from its own loopback source address, so that the ephemeral ports of one
// address do not run out.
//
//	make build && cd bench && go run ./fdflood -sluice ../bin/sluice
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// perChild is how many connections one flooding process opens: under the
// usual hard limit of 20,000 descriptors.
const perChild = 15000

func main() {
	bin := flag.String("sluice", "sluice", "the sluice binary")
	sizes := flag.String("floods", "20000,40000", "the floods' sizes, in idle connections")
	hold := flag.Duration("hold", 10*time.Second, "how long each flood is held once opened")
	serveConfig := flag.String("serve-config", "../examples/nginx/policy.yaml", "the policy sluice serve runs")
	target := flag.String("child", "", "internal: open -n idle connections to this address and hold them until stdin closes")
	src := flag.String("src", "", "internal: the child's source address")
	n := flag.Int("n", 0, "internal: the child's connection count")
	flag.Parse()
	if *target != "" {
		child(*target, *src, *n)
		return
	}
	var floods []int
	for _, f := range strings.Split(*sizes, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "fdflood: -floods %q: want positive counts\n", *sizes)
			os.Exit(2)
		}
		floods = append(floods, v)
	}
	failed := false
	for _, kind := range []string{"proxy", "serve"} {
		if err := run(kind, *bin, *serveConfig, floods, *hold); err != nil {
			fmt.Printf("%s: FAIL: %v\n", kind, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// child opens n connections from src to target, reports how many it got,
// and holds them until its stdin closes.
func child(target, src string, n int) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	var conns []net.Conn
	failures := 0
	for range n {
		c, err := d.Dial("tcp", target)
		if err != nil {
			failures++
			continue
		}
		conns = append(conns, c)
	}
	// Which of them the server answered and closed (a refusal past its
	// budget), and which it holds idle.
	var wg sync.WaitGroup
	var refused atomic.Int64
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var b [1]byte
			if _, err := c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("opened %d failed %d refused %d\n", len(conns), failures, refused.Load())
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

// process is a running sluice command and what its log said.
type process struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

func start(bin string, args ...string) (*process, error) {
	p := &process{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// field returns the value of key in the first log line containing marker.
func (p *process) field(marker, key string) (string, error) {
	re := regexp.MustCompile(`\b` + key + `=("[^"]*"|\S+)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, l := range strings.Split(p.logText(), "\n") {
			if strings.Contains(l, marker) {
				if m := re.FindStringSubmatch(l); m != nil {
					return strings.Trim(m[1], `"`), nil
				}
			}
		}
		if !p.alive() {
			return "", fmt.Errorf("exited before logging %q:\n%s", marker, p.logText())
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no log line %q with %s= in 20 s", marker, key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *process) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) stop() {
	p.cmd.Process.Kill()
	<-p.done
}

// rssMiB reads the process's resident memory.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func run(kind, bin, serveConfig string, floods []int, hold time.Duration) error {
	dir, err := os.MkdirTemp("", "fdflood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var p *process
	var addr, url string
	switch kind {
	case "proxy":
		ul, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ul.Close()
		go http.Serve(ul, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		pol := filepath.Join(dir, "p.yaml")
		if err := os.WriteFile(pol, []byte("version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 100}\n"), 0o644); err != nil {
			return err
		}
		if p, err = start(bin, "proxy", "--config", pol, "--upstream", "http://"+ul.Addr().String(), "--listen", "127.0.0.1:0",
			"--admin", "127.0.0.1:0", "--admin-token", "fdflood"); err != nil {
			return err
		}
		limit, err := p.field("sluice proxy descriptors", "file_limit")
		if err != nil {
			return err
		}
		budget, _ := p.field("sluice proxy descriptors", "max_client_conns")
		fmt.Printf("proxy: file limit %s, client connections at most %s\n", limit, budget)
		if addr, err = p.field("sluice proxy serving", "listen"); err != nil {
			return err
		}
		url = "http://" + addr + "/x"
	case "serve":
		if p, err = start(bin, "serve", "--config", serveConfig, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
			"--admin", "127.0.0.1:0", "--admin-token", "fdflood"); err != nil {
			return err
		}
		if addr, err = p.field("sluice serve deciding", "http"); err != nil {
			return err
		}
		url = "http://" + addr + "/"
		fmt.Printf("serve: its HTTP decision listener flooded\n")
	}
	defer p.stop()
	for _, n := range floods {
		if err := flood(kind, p, addr, url, n, hold); err != nil {
			return err
		}
	}
	return nil
}

// probes counts the prober's answers.
type probes struct{ served, refused, other, none atomic.Int64 }

func (c *probes) String() string {
	return fmt.Sprintf("%d served, %d refused (503), %d no answer, %d other", c.served.Load(), c.refused.Load(), c.none.Load(), c.other.Load())
}

func probe(url string) int {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// servedCode is what counts as served: the proxy's upstream answers 200;
// serve's decision endpoint answers a bare GET with a decision of its own.
func servedCode(kind string, code int) bool {
	if kind == "serve" {
		return code != 0 && code != 503
	}
	return code == 200
}

func flood(kind string, p *process, addr, url string, n int, hold time.Duration) error {
	var during probes
	stopProbe := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopProbe:
				return
			case <-t.C:
			}
			switch code := probe(url); {
			case servedCode(kind, code):
				during.served.Add(1)
			case code == 503:
				during.refused.Add(1)
			case code == 0:
				during.none.Add(1)
			default:
				during.other.Add(1)
			}
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var children []*exec.Cmd
	var stdins []io.WriteCloser
	opened, failed, refused := 0, 0, 0
	var outs []*bufio.Reader
	for i := 0; i*perChild < n; i++ {
		c := exec.Command(self, "-child", addr, "-src", fmt.Sprintf("127.0.0.%d", 10+i), "-n", strconv.Itoa(min(perChild, n-i*perChild)))
		in, err := c.StdinPipe()
		if err != nil {
			return err
		}
		out, err := c.StdoutPipe()
		if err != nil {
			return err
		}
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			return err
		}
		children, stdins, outs = append(children, c), append(stdins, in), append(outs, bufio.NewReader(out))
	}
	for _, r := range outs {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("a flooding process: %v", err)
		}
		var o, f, r int
		fmt.Sscanf(line, "opened %d failed %d refused %d", &o, &f, &r)
		opened, failed, refused = opened+o, failed+f, refused+r
	}
	rss := rssMiB(p.cmd.Process.Pid)
	time.Sleep(hold)
	rss = max(rss, rssMiB(p.cmd.Process.Pid))
	up := p.alive()
	close(stopProbe)
	wg.Wait()
	for i, in := range stdins {
		in.Close()
		children[i].Wait()
	}
	fmt.Printf("%s, flood of %d: %d connected (%d of them answered and closed, %d held idle), %d not connected within 2 s; held %v; %s up, resident %.0f MiB; probes during: %v\n",
		kind, n, opened, refused, opened-refused, failed, hold, map[bool]string{true: "stayed", false: "did NOT stay"}[up], rss, &during)
	if !up {
		return fmt.Errorf("exited under a flood of %d:\n%s", n, p.logText())
	}
	if during.other.Load() > 0 {
		return errors.New("a probe during the flood got an answer other than 200 or 503")
	}
	end := time.Now()
	for row := 0; row < 20; {
		if servedCode(kind, probe(url)) {
			row++
			continue
		}
		row = 0
		if time.Since(end) > 20*time.Second {
			return fmt.Errorf("not served 20 times in a row within 20 s of the flood's end")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("%s, flood of %d: served 20 times in a row %.2f s after it ended\n", kind, n, time.Since(end).Seconds())
	return nil
}
