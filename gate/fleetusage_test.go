package gate_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

func TestFleetUsageLimit(t *testing.T) {
	if n, _ := gate.FleetUsageLimit(100, map[string]float64{"critical": 0.2}); n != 80 {
		t.Fatalf("%d", n)
	}
	for _, r := range []map[string]float64{{"critical": 0}, {"critical": 1}, {"a": 0.6, "b": 0.5}} {
		if _, err := gate.FleetUsageLimit(100, r); err == nil {
			t.Errorf("%v accepted", r)
		}
	}
}

// hammer runs 1,000 sheddable requests and a stream of critical ones
// through chain at once; it returns the most sheddable requests held at
// once and how many critical requests were rejected.
func hammer(t *testing.T, chain *sluice.Chain, d time.Duration) (maxHeld int64, criticalRejected, sheddableAdmitted int64) {
	var held, peak, crit, adm atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				d, _ := chain.Do(context.Background(), &sluice.Request{Class: "sheddable"}, func(context.Context) error {
					n := held.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
					held.Add(-1)
					return nil
				})
				if d.Admitted {
					adm.Add(1)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				d, _ := chain.Do(context.Background(), &sluice.Request{Class: "critical"}, func(context.Context) error {
					time.Sleep(time.Millisecond)
					return nil
				})
				if !d.Admitted {
					crit.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return peak.Load(), crit.Load(), adm.Load()
}

func fleetChain(t *testing.T, lim store.Limiter) *sluice.Chain {
	t.Helper()
	g, err := gate.NewFleetUsage("fleet-usage", lim, []string{"critical"}, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sluice.NewChain(sluice.ChainOptions{}, g)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Reserve 20% of 100: 1,000 concurrent sheddable requests never hold more
// than 80 slots while critical requests keep being admitted.
func TestFleetUsageMemory(t *testing.T) {
	n, _ := gate.FleetUsageLimit(100, map[string]float64{"critical": 0.2})
	c, _ := limit.NewConcurrency(n)
	chain := fleetChain(t, memory.NewKeyed(c, memory.Options{}))
	peak, crit, adm := hammer(t, chain, time.Second)
	if peak > 80 || crit != 0 || adm == 0 {
		t.Fatalf("peak %d sheddable held (max 80), %d critical rejected, %d sheddable admitted", peak, crit, adm)
	}
	d, _ := chain.Decide(context.Background(), &sluice.Request{Class: "sheddable"})
	if !d.Admitted {
		t.Fatal("slots leaked")
	}
	t.Logf("peak %d of 80 sheddable slots, %d sheddable admitted, no critical rejected", peak, adm)
}

// The same across 3 processes sharing the budget on Redis: the peak is
// read from a Redis counter every process updates.
func TestFleetUsageRedisThreeProcesses(t *testing.T) {
	srv := redistest.Start(t)
	var outs [3][]byte
	var stderrs [3]bytes.Buffer
	var errs [3]error
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "SLUICE_FLEET_USAGE="+srv.Addr)
			cmd.Stderr = &stderrs[i] // a log line there must not break the result on stdout
			outs[i], errs[i] = cmd.Output()
		}()
	}
	wg.Wait()
	var admitted int64
	for i := range 3 {
		if errs[i] != nil {
			t.Fatalf("process %d: %v\n%s\n%s", i, errs[i], outs[i], stderrs[i].String())
		}
		var f []string
		for _, line := range strings.Split(string(outs[i]), "\n") {
			if strings.HasPrefix(line, "RESULT ") {
				f = strings.Fields(line)
			}
		}
		if len(f) != 4 {
			t.Fatalf("process %d: no RESULT line in %q", i, outs[i])
		}
		peak, _ := strconv.ParseInt(f[1], 10, 64)
		crit, _ := strconv.ParseInt(f[2], 10, 64)
		adm, _ := strconv.ParseInt(f[3], 10, 64)
		if peak > 80 || crit != 0 {
			t.Fatalf("process %d: fleet-wide peak %d sheddable held (max 80), %d critical rejected", i, peak, crit)
		}
		admitted += adm
	}
	if admitted == 0 {
		t.Fatal("nothing admitted")
	}
}

// fleetUsageHelper is one of the 3 processes: 300 sheddable callers and a
// critical stream on the shared Redis budget; holders are counted in Redis.
func fleetUsageHelper() {
	addr := os.Getenv("SLUICE_FLEET_USAGE")
	st, err := sredis.New(sredis.Options{Addrs: []string{addr}, Timeout: 2 * time.Second})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	defer st.Close()
	c, _ := limit.NewConcurrency(80)
	sp, _ := sredis.SpecOf("fleet-usage", c)
	lim := st.Limiter(sp)
	g, _ := gate.NewFleetUsage("fleet-usage", lim, []string{"critical"}, gate.Options{OnFailure: gate.FailClosed})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	csp, _ := sredis.SpecOf("holders-counter", mustConc(1_000_000))
	counter := st.Limiter(csp)
	var peak, crit, adm atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				d, _ := chain.Do(context.Background(), &sluice.Request{Class: "sheddable"}, func(ctx context.Context) error {
					r, h, err := counter.Take(ctx, "", 0, 1, 0) // one fleet-wide holder more
					if err == nil {
						if held := r.Limit - r.Remaining; held > peak.Load() {
							peak.Store(held)
						}
					}
					time.Sleep(time.Duration(2+rand.IntN(4)) * time.Millisecond)
					counter.Refund(ctx, "", h, 0, 1)
					return nil
				})
				if d.Admitted {
					adm.Add(1)
				} else {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(stop) {
			if d, _ := chain.Do(context.Background(), &sluice.Request{Class: "critical"}, func(context.Context) error { return nil }); !d.Admitted {
				crit.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	fmt.Printf("RESULT %d %d %d\n", peak.Load(), crit.Load(), adm.Load())
}

func mustConc(n int64) *limit.Concurrency {
	c, err := limit.NewConcurrency(n)
	if err != nil {
		panic(err)
	}
	return c
}
