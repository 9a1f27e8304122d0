package redis

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

func init() {
	switch os.Getenv("SLUICE_FLEET") {
	case "load":
		fleetLoad()
		os.Exit(0)
	case "hold":
		fleetHold()
		os.Exit(0)
	}
}

func helperStore() (*Store, *limiter) {
	st, err := New(Options{Addrs: []string{os.Getenv("SLUICE_REDIS")}, Timeout: 2 * time.Second})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	n, _ := strconv.ParseInt(os.Getenv("SLUICE_LIMIT"), 10, 64)
	c, _ := limit.NewConcurrency(n)
	l, _ := bind(st)(concurrencySpec("fleet", c, time.Second))
	return st, l.(*limiter)
}

// fleetLoad: 16 goroutines take and release permits for 2 s, counting
// holders in a shared Redis counter; a count above the limit is a violation.
func fleetLoad() {
	st, l := helperStore()
	defer st.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, violations := 0, 0
	deadline := time.Now().Add(2 * time.Second)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				r, h, err := l.Take(ctx, "svc", 0, 1, 0)
				if err != nil || !r.OK() {
					time.Sleep(time.Millisecond)
					continue
				}
				n, _ := st.rc().Do(ctx, st.rc().B().Incr().Key("holders").Build()).AsInt64()
				mu.Lock()
				admitted++
				if n > l.limit {
					violations++
				}
				mu.Unlock()
				time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
				st.rc().Do(ctx, st.rc().B().Decr().Key("holders").Build())
				l.Refund(ctx, "svc", h, 0, 1)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("RESULT %d %d\n", admitted, violations)
}

// fleetHold takes every permit, says so, and waits to be killed.
func fleetHold() {
	_, l := helperStore()
	for i := int64(0); i < l.limit; i++ {
		if r, _, err := l.Take(context.Background(), "svc", 0, 1, 0); err != nil || !r.OK() {
			fmt.Println("ERROR could not take a permit", err)
			os.Exit(1)
		}
	}
	fmt.Println("HELD")
	select {} // until killed
}

func helper(t *testing.T, mode, addr string, limit int) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLUICE_FLEET="+mode, "SLUICE_REDIS="+addr, "SLUICE_LIMIT="+strconv.Itoa(limit))
	return cmd
}

// In-flight never exceeds the limit across 4 processes.
func TestFleetConcurrencyAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	const limitN = 10
	var outs [4][]byte
	var errs [4]error
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = helper(t, "load", srv.Addr, limitN).CombinedOutput()
		}()
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("process %d: %v\n%s", i, errs[i], outs[i])
		}
		var adm, vio int
		if _, err := fmt.Sscanf(lastLine(string(outs[i])), "RESULT %d %d", &adm, &vio); err != nil {
			t.Fatalf("process %d: %q", i, outs[i])
		}
		if vio != 0 {
			t.Fatalf("process %d saw %d moments with more than %d holders across the fleet", i, vio, limitN)
		}
		total += adm
	}
	if total < 100 {
		t.Fatalf("only %d admissions in total", total)
	}
	t.Logf("%d admissions across 4 processes, never more than %d in flight", total, limitN)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Permits of a holder that is killed expire after the TTL.
func TestFleetPermitsOfKilledHolderExpire(t *testing.T) {
	srv := redistest.Start(t)
	cmd := helper(t, "hold", srv.Addr, 5)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "HELD" {
		t.Fatalf("holder: %q", line)
	}
	cmd.Process.Kill()
	cmd.Wait()
	killed := time.Now()

	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, _ := limit.NewConcurrency(5)
	l, _ := bind(st)(concurrencySpec("fleet", c, time.Second))
	if r, _, _ := l.Take(context.Background(), "svc", 0, 1, 0); r.OK() {
		t.Fatal("permits of the killed holder vanished before their TTL")
	}
	poll.Until(t, 10*time.Second, func() bool {
		r, _, err := l.Take(context.Background(), "svc", 0, 1, 0)
		return err == nil && r.OK()
	})
	if waited := time.Since(killed); waited < 900*time.Millisecond {
		t.Fatalf("permits expired after %v, before the 1 s TTL", waited)
	}
}
