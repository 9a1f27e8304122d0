// Command rlsload drives a rate limit service (Envoy's
// envoy.service.ratelimit.v3.RateLimitService) with closed-loop
// ShouldRateLimit load over gRPC and reports throughput and latency. It
// only takes addresses, so it measures any implementation of the protocol
// the same way: `sluice serve` and envoyproxy/ratelimit alike.
//
//	go run ./rlsload -target sluice=127.0.0.1:8081 -target peer=127.0.0.1:18081 -rounds 3 -duration 10s -mix under
//
// With several targets, rounds are interleaved (each target once per
// round, in the order given) so that drifts of a shared machine spread
// over every target, and the summary gives each target's median round.
//
// Every worker (-workers, 64 by default) sends one call at a time, the
// next as soon as the answer arrives, over -conns gRPC connections (the
// workers share them round robin). A call carries one descriptor
// (tenant=tN, N uniform over -keys keys) from the domain "bench" of
// config.yaml beside this file, whose tenant limit is never reached; with
// -mix over, a -hot fraction of the calls go to tenant=hot, limited to
// 100 per second, so that they are answered OVER_LIMIT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// target is one service to measure, and optionally its process (on this
// machine) whose CPU time a round reports.
type target struct {
	name, addr string
	pid        int
}

type targets []target

func (ts *targets) String() string {
	var s []string
	for _, t := range *ts {
		s = append(s, t.name+"="+t.addr)
	}
	return strings.Join(s, ",")
}

func (ts *targets) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok {
		name, addr = v, v
	}
	t := target{name: name, addr: addr}
	if a, pid, ok := strings.Cut(addr, "@"); ok {
		n, err := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			return fmt.Errorf("target %q: the process id after @ must be a number", v)
		}
		t.addr, t.pid = a, n
	}
	*ts = append(*ts, t)
	return nil
}

// cpuTime returns the user and system CPU time process pid has used, from
// /proc (Linux); 0 when it cannot be read.
func cpuTime(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name (which is in parentheses and may
	// hold spaces): utime and stime are the 12th and 13th, in clock ticks.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, 100 on every Linux platform Go
// supports.
const clockTicks = 100

// result is one round against one target.
type result struct {
	Target    string        `json:"target"`
	Round     int           `json:"round"`
	Mix       string        `json:"mix"`
	Calls     int64         `json:"calls"`
	OK        int64         `json:"ok"`
	Over      int64         `json:"over_limit"`
	Errors    int64         `json:"errors"`
	Seconds   float64       `json:"seconds"`
	PerSecond float64       `json:"calls_per_second"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	P999      time.Duration `json:"p999_ns"`
	Max       time.Duration `json:"max_ns"`
	// CPUPerCall is the target process's CPU time per call (with a
	// process id given), the service's whole cost on this machine.
	CPUPerCall time.Duration `json:"cpu_per_call_ns,omitempty"`
	FirstErr   string        `json:"first_error,omitempty"`
}

func main() {
	var ts targets
	flag.Var(&ts, "target", "NAME=HOST:PORT[@PID] of a RateLimitService (repeatable); rounds interleave the targets; with the process id of a local server, rounds report its CPU time per call")
	workers := flag.Int("workers", 64, "concurrent callers (closed loop: one call in flight each)")
	conns := flag.Int("conns", 64, "gRPC connections per target, shared round robin by the workers")
	duration := flag.Duration("duration", 10*time.Second, "measured time of one round")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured load before each round")
	rounds := flag.Int("rounds", 3, "rounds per target")
	mix := flag.String("mix", "under", "under (every call within its limit) or over (a -hot fraction of the calls over the limit)")
	hot := flag.Float64("hot", 0.2, "with -mix over, the fraction of calls to the tenant limited to 100/s")
	keys := flag.Int("keys", 1000, "distinct tenants of the calls within their limit")
	domain := flag.String("domain", "bench", "the calls' domain")
	timeout := flag.Duration("timeout", time.Second, "deadline of each call")
	jsonOut := flag.String("json", "", "also write every round as JSON to this file")
	clientKind := flag.String("client", "grpc", "grpc (grpc-go's client) or raw (gRPC's wire format on a bare HTTP/2 framer: a fraction of grpc-go's CPU per call, for the service it shares the machine with; see raw.go)")
	flag.Parse()
	if len(ts) == 0 {
		fmt.Fprintln(os.Stderr, "rlsload: give at least one -target NAME=HOST:PORT")
		os.Exit(2)
	}
	if *mix != "under" && *mix != "over" {
		fmt.Fprintln(os.Stderr, "rlsload: -mix under or over")
		os.Exit(2)
	}
	if *clientKind != "grpc" && *clientKind != "raw" {
		fmt.Fprintln(os.Stderr, "rlsload: -client grpc or raw")
		os.Exit(2)
	}
	if *workers < 1 || *conns < 1 || *keys < 1 || *rounds < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "rlsload: -workers, -conns, -keys, -rounds and -duration must be positive")
		os.Exit(2)
	}
	hotShare := 0.0
	if *mix == "over" {
		hotShare = *hot
	}
	// The requests, built once: a call's cost is the service's, not ours.
	reqs := make([]*rlspb.RateLimitRequest, *keys)
	for i := range reqs {
		reqs[i] = request(*domain, fmt.Sprintf("t%d", i))
	}
	hotReq := request(*domain, "hot")

	msgs := make([][]byte, len(reqs))
	for i, r := range reqs {
		msgs[i] = rawRequest(r)
	}
	hotMsg := rawRequest(hotReq)

	// callers[target][connection] makes a worker's call function: req is
	// an index into reqs, or -1 for the hot tenant.
	callers := map[string][]func() func(req int) (rlspb.RateLimitResponse_Code, error){}
	for _, t := range ts {
		for range *conns {
			var mk func() func(int) (rlspb.RateLimitResponse_Code, error)
			if *clientKind == "raw" {
				rc, err := dialRaw(t.addr, *timeout)
				if err != nil {
					fmt.Fprintf(os.Stderr, "rlsload: %s: %v\n", t.name, err)
					os.Exit(1)
				}
				defer rc.Close()
				mk = func() func(int) (rlspb.RateLimitResponse_Code, error) {
					c := &rawCall{done: make(chan struct{}, 1)}
					return func(req int) (rlspb.RateLimitResponse_Code, error) {
						m := hotMsg
						if req >= 0 {
							m = msgs[req]
						}
						return rc.call(m, c)
					}
				}
			} else {
				cc, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					fmt.Fprintf(os.Stderr, "rlsload: %s: %v\n", t.name, err)
					os.Exit(1)
				}
				defer cc.Close()
				client := rlspb.NewRateLimitServiceClient(cc)
				mk = func() func(int) (rlspb.RateLimitResponse_Code, error) {
					return func(req int) (rlspb.RateLimitResponse_Code, error) {
						r := hotReq
						if req >= 0 {
							r = reqs[req]
						}
						ctx, cancel := context.WithTimeout(context.Background(), *timeout)
						resp, err := client.ShouldRateLimit(ctx, r)
						cancel()
						return resp.GetOverallCode(), err
					}
				}
			}
			callers[t.name] = append(callers[t.name], mk)
		}
	}
	fmt.Printf("rlsload: %d workers, %d connections per target (%s client), %v per round after %v of warm-up, %d round(s), mix %s",
		*workers, *conns, *clientKind, *duration, *warmup, *rounds, *mix)
	if *mix == "over" {
		fmt.Printf(" (%.0f%% of the calls over the limit)", hotShare*100)
	}
	fmt.Println()
	fmt.Printf("%-14s %5s %12s %9s %9s %9s %9s %8s %8s %9s\n", "target", "round", "calls/s", "p50", "p99", "p99.9", "max", "over %", "errors", "cpu/call")
	var all []result
	for round := 1; round <= *rounds; round++ {
		for _, t := range ts {
			cs := callers[t.name]
			if *warmup > 0 {
				drive(cs, *workers, *warmup, len(reqs), hotShare, false)
			}
			cpu0 := cpuTime(t.pid)
			r := drive(cs, *workers, *duration, len(reqs), hotShare, true)
			if cpu := cpuTime(t.pid) - cpu0; cpu > 0 && r.Calls > 0 {
				r.CPUPerCall = cpu / time.Duration(r.Calls)
			}
			r.Target, r.Round, r.Mix = t.name, round, *mix
			all = append(all, r)
			fmt.Printf("%-14s %5d %12.0f %9v %9v %9v %9v %8.1f %8d %9v\n", r.Target, r.Round, r.PerSecond, round2(r.P50), round2(r.P99),
				round2(r.P999), round2(r.Max), 100*float64(r.Over)/float64(max(r.Calls, 1)), r.Errors, cpuText(r.CPUPerCall))
			if r.FirstErr != "" {
				fmt.Printf("  first error: %s\n", r.FirstErr)
			}
		}
	}
	if *rounds > 1 || len(ts) > 1 {
		fmt.Println("\nmedian round by target (by throughput; p99 is the median of the rounds' p99s):")
		fmt.Printf("%-14s %12s %9s %9s\n", "target", "calls/s", "p50", "p99")
		var base *result
		for _, t := range ts {
			var rs []result
			for _, r := range all {
				if r.Target == t.name {
					rs = append(rs, r)
				}
			}
			m := median(rs)
			fmt.Printf("%-14s %12.0f %9v %9v", t.name, m.PerSecond, round2(m.P50), round2(m.P99))
			if base == nil {
				base = &m
				fmt.Println()
			} else {
				fmt.Printf("   %s: %.2fx its throughput, %.2fx its p99\n", ts[0].name, base.PerSecond/m.PerSecond, float64(base.P99)/float64(m.P99))
			}
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(all, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "rlsload:", err)
			os.Exit(1)
		}
	}
}

func cpuText(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

func request(domain, tenant string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*descpb.RateLimitDescriptor{
		{Entries: []*descpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}}}
}

// drive runs the closed loop for d and, when measure is set, returns the
// round's figures. Worker w calls through connection w mod len(cs); a
// call is for one of nreqs tenants, or for the hot one with probability
// hotShare.
func drive(cs []func() func(req int) (rlspb.RateLimitResponse_Code, error), workers int, d time.Duration, nreqs int,
	hotShare float64, measure bool) result {
	var calls, ok, over, errs atomic.Int64
	var firstErr atomic.Value
	lats := make([][]time.Duration, workers)
	var stop atomic.Bool
	var wg sync.WaitGroup
	begin := time.Now()
	for w := range workers {
		wg.Add(1)
		call := cs[w%len(cs)]()
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(begin.UnixNano())))
			var mine []time.Duration
			if measure {
				mine = make([]time.Duration, 0, 1<<16)
			}
			for !stop.Load() {
				req := rng.IntN(nreqs)
				if hotShare > 0 && rng.Float64() < hotShare {
					req = -1
				}
				t0 := time.Now()
				code, err := call(req)
				lat := time.Since(t0)
				calls.Add(1)
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case code == rlspb.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				default:
					ok.Add(1)
				}
				if measure {
					mine = append(mine, lat)
				}
			}
			lats[w] = mine
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(begin)
	if !measure {
		return result{}
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	r := result{Calls: calls.Load(), OK: ok.Load(), Over: over.Load(), Errors: errs.Load(), Seconds: elapsed.Seconds()}
	r.PerSecond = float64(r.Calls) / elapsed.Seconds()
	if len(all) > 0 {
		r.P50, r.P99, r.P999, r.Max = quantile(all, 0.5), quantile(all, 0.99), quantile(all, 0.999), all[len(all)-1]
	}
	if e, ok := firstErr.Load().(string); ok {
		r.FirstErr = e
	}
	return r
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// median returns the round of median throughput, with the median p50 and
// p99 of the rounds.
func median(rs []result) result {
	sort.Slice(rs, func(i, j int) bool { return rs[i].PerSecond < rs[j].PerSecond })
	m := rs[len(rs)/2]
	p50s, p99s := make([]time.Duration, len(rs)), make([]time.Duration, len(rs))
	for i, r := range rs {
		p50s[i], p99s[i] = r.P50, r.P99
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	m.P50, m.P99 = p50s[len(rs)/2], p99s[len(rs)/2]
	return m
}

func round2(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= 10*time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}
