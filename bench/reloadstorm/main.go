// Command reloadstorm checks that a reload storm on one process of a
// leased fleet keeps the fleet's bounds: it starts a Redis, an upstream
// that counts what it has in flight, and two `sluice proxy` processes
// sharing a Redis-leased rate and concurrency budget; offers each proxy an
// open-loop load above its share; and after a warm-up sends one of them
// SIGHUPs at -hup per second for -storm, replacing its policy file (a
// changed retry hint, so the gates are rebuilt) before each signal. It
// prints what the fleet admitted every second and the most it had in
// flight at the upstream, and fails when a second passes C·(1 s + burst
// time) or the flight passes the slot budget.
//
//	make build && cd bench && go run ./reloadstorm -sluice ../bin/sluice
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	rate  = 200 // the fleet's budget, requests/s
	burst = 20  // its bucket: 100 ms of the rate
	slots = 4   // the fleet's concurrency budget
)

func main() {
	bin := flag.String("sluice", "sluice", "the sluice binary")
	redisBin := flag.String("redis-server", "redis-server", "the redis-server binary")
	offered := flag.Int("rate", 300, "requests/s offered to each proxy")
	warm := flag.Duration("warm", 10*time.Second, "load before the storm")
	storm := flag.Duration("storm", 30*time.Second, "how long the storm lasts")
	hup := flag.Int("hup", 20, "SIGHUPs per second")
	flag.Parse()
	if err := run(*bin, *redisBin, *offered, *warm, *storm, *hup); err != nil {
		fmt.Fprintln(os.Stderr, "reloadstorm:", err)
		os.Exit(1)
	}
}

func run(bin, redisBin string, offered int, warm, storm time.Duration, hup int) error {
	dir, err := os.MkdirTemp("", "reloadstorm")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	redisAddr, upAddr := freeAddr(), freeAddr()
	_, redisPort, _ := net.SplitHostPort(redisAddr)
	redis := exec.Command(redisBin, "--port", redisPort, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := redis.Start(); err != nil {
		return err
	}
	defer func() { redis.Process.Kill(); redis.Wait() }()

	var inFlight, most atomic.Int64
	go http.ListenAndServe(upAddr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		inFlight.Add(-1)
	}))

	policy := func(file string, hint int) error {
		body := fmt.Sprintf(`version: 1
service: storm
store: {backend: redis, addrs: [%q]}
gates:
  - {name: fleet-rate, kind: token_bucket, scope: service, rate: %d/s, burst: %d, retry_hint: %dms, lease: {time: 2s, refresh: 500ms}}
  - {name: fleet-pool, kind: concurrency, scope: service, limit: %d, retry_hint: %dms, lease: {time: 2s, refresh: 500ms}}
`, redisAddr, rate, burst, 100+hint%2, slots, 100+hint%2)
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, file) // replaced whole, as an operator's tools do
	}
	var proxies []*exec.Cmd
	var addrs []string
	for _, name := range []string{"a", "b"} {
		file := filepath.Join(dir, name+".yaml")
		if err := policy(file, 0); err != nil {
			return err
		}
		addr := freeAddr()
		p := exec.Command(bin, "proxy", "--config", file, "--upstream", "http://"+upAddr, "--listen", addr,
			"--admin", freeAddr(), "--admin-token", "storm")
		if err := p.Start(); err != nil {
			return err
		}
		defer func() { p.Process.Kill(); p.Wait() }()
		proxies, addrs = append(proxies, p), append(addrs, addr)
	}
	for _, a := range addrs {
		if err := waitListening(a); err != nil {
			return err
		}
	}

	secs := int((warm + storm + 5*time.Second) / time.Second)
	ok := make([]atomic.Int64, secs+2)
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}, Timeout: 5 * time.Second}
	start := time.Now()
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Add(1)
		go func() { // open loop: a request every tick, answered or not
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(offered))
			defer tick.Stop()
			for time.Since(start) < time.Duration(secs)*time.Second {
				<-tick.C
				go func() {
					resp, err := cl.Get("http://" + a + "/x")
					if err != nil {
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if s := int(time.Since(start) / time.Second); resp.StatusCode == http.StatusOK && s < len(ok) {
						ok[s].Add(1)
					}
				}()
			}
		}()
	}
	var signals atomic.Int64
	go func() {
		time.Sleep(warm)
		for end := time.Now().Add(storm); time.Now().Before(end); time.Sleep(time.Second / time.Duration(hup)) {
			policy(filepath.Join(dir, "a.yaml"), int(signals.Add(1)))
			proxies[0].Process.Signal(syscall.SIGHUP)
		}
	}()
	worst, crowd := int64(0), int64(0)
	for s := range secs {
		time.Sleep(time.Until(start.Add(time.Duration(s+1) * time.Second)))
		m := most.Swap(0)
		time.Sleep(300 * time.Millisecond) // the second's last answers
		n := ok[s].Load()
		phase := "warm"
		if at := time.Duration(s) * time.Second; at >= warm && at < warm+storm {
			phase = "storm"
		} else if at >= warm+storm {
			phase = "after"
		}
		fmt.Printf("second %2d (%s): admitted %3d, at most %d in flight\n", s, phase, n, m)
		if s > 0 {
			worst = max(worst, n)
		}
		crowd = max(crowd, m)
	}
	wg.Wait()
	bound := int64(rate + burst)
	fmt.Printf("%d SIGHUPs; the most admitted in a second: %d (bound %d); the most in flight: %d (budget %d)\n", signals.Load(), worst, bound, crowd, slots)
	if worst > bound || crowd > slots {
		return fmt.Errorf("a bound was passed")
	}
	return nil
}

// freeAddr returns a loopback address with a port free now.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitListening waits up to 10 s for addr to accept connections.
func waitListening(addr string) error {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("nothing listens on %s", addr)
}
