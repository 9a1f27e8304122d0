package demo

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// mix is the demo's request mix, weights summing to 100:
// 50% GET /v1/routes/{id}, 40% POST /v1/routes with 10..290 stops,
// 10% GET /v1/analytics/daily; the tenants share the load equally.
func mixTarget(base string, tenants int, deadline time.Duration) vegeta.Targeter {
	return skewedMix(base, tenants, 0, 0, deadline)
}

// skewedMix is mixTarget with tenant-i's share of the load falling as
// 1/(i+1)^skew (Zipf's law; 0: equal shares): with 100 tenants and skew 1,
// tenant-0 sends 19% of the requests, tenant-1 10% and tenant-99 0.2%.
// A seed other than 0 makes the sequence of requests repeat from run to
// run (two runs with one seed send the same requests in the same order).
func skewedMix(base string, tenants int, skew float64, seed uint64, deadline time.Duration) vegeta.Targeter {
	timeout := deadline.String()
	var mu sync.Mutex // vegeta's workers call the targeter concurrently
	var rng *rand.Rand
	if seed != 0 {
		rng = rand.New(rand.NewPCG(seed, 0x64656d6f))
	}
	intN := func(n int) int {
		if rng == nil {
			return rand.IntN(n)
		}
		return rng.IntN(n)
	}
	float := func() float64 {
		if rng == nil {
			return rand.Float64()
		}
		return rng.Float64()
	}
	pick := func() int { return intN(tenants) }
	if skew > 0 {
		cum := make([]float64, tenants) // cumulative weights
		total := 0.0
		for i := range cum {
			total += math.Pow(float64(i+1), -skew)
			cum[i] = total
		}
		pick = func() int {
			i, _ := slices.BinarySearch(cum, float()*total)
			return min(i, tenants-1)
		}
	}
	return func(t *vegeta.Target) error {
		h := http.Header{}
		mu.Lock()
		tenant, n, id, stops := pick(), intN(100), intN(100000), 10+intN(281)
		mu.Unlock()
		h.Set("X-Api-Key", "tenant-"+strconv.Itoa(tenant))
		h.Set("X-Request-Timeout", timeout)
		switch {
		case n < 50:
			t.Method, t.URL = http.MethodGet, base+"/v1/routes/"+strconv.Itoa(id)
		case n < 90:
			t.Method, t.URL = http.MethodPost, base+"/v1/routes"
			h.Set("X-Stops", strconv.Itoa(stops))
		default:
			t.Method, t.URL = http.MethodGet, base+"/v1/analytics/daily"
		}
		t.Header = h
		return nil
	}
}

// MeanServiceTime is the mix's expected service time.
func MeanServiceTime() time.Duration {
	post := ServiceTime(http.MethodPost, "/v1/routes", 150) // mean stops 150
	return time.Duration(0.5*float64(ServiceTime(http.MethodGet, "/v1/routes/1", 0)) +
		0.4*float64(post) + 0.1*float64(ServiceTime(http.MethodGet, "/v1/analytics/daily", 0)))
}

// Step is one load level of a sweep. Rates are per second of attack.
type Step struct {
	Multiplier float64 `json:"multiplier"`
	// TargetRPS is the rate the step asked for; OfferedRPS is what the load
	// generator sent. On a busy machine it can fall behind (Behind).
	TargetRPS  float64 `json:"target_rps"`
	OfferedRPS float64 `json:"offered_rps"`
	// UsefulWork is the upstream worker time spent on useful answers per
	// second of attack, in workers (8 means all of 8 workers all the time).
	UsefulWork  float64            `json:"useful_work"`
	AdmittedRPS float64            `json:"admitted_rps"`
	GoodputRPS  float64            `json:"goodput_rps"`
	LateRPS     float64            `json:"late_rps"`
	ErroredRPS  float64            `json:"errored_rps"`
	RejectedRPS map[string]float64 `json:"rejected_rps"`
	// GoodputByClass splits goodput by the policy's classes of the demo's
	// routes: critical (route solves), default (reads), sheddable (analytics).
	GoodputByClass map[string]float64 `json:"goodput_by_class_rps"`
	P50Ms          float64            `json:"p50_ms"`
	P99Ms          float64            `json:"p99_ms"`
}

// attack sends open-loop load at rate rps to base for d, with a client
// deadline, and classifies every response: useful (200 within the deadline:
// goodput), late (no useful answer by the deadline), rejected by reason
// (429/503/400, read from the envelope), errored (anything else).
func attack(ctx context.Context, base string, rps float64, warm, d, deadline time.Duration, tenants int) Step {
	st := attackAt(ctx, base, rps, warm, d, deadline, tenants)
	st.TargetRPS = rps
	return st
}

// Behind reports whether the load generator sent less than 95% of the
// step's target rate (its own machine was too busy): the step's figures
// then understate the load.
func (s *Step) Behind() bool { return s.TargetRPS > 0 && s.OfferedRPS < 0.95*s.TargetRPS }

// attackAt offers rps for warm + d and measures the requests sent in the
// last d: the first warm lets a fresh proxy's adaptive limit find the
// upstream (it starts from one request in flight), as a proxy that has
// been running would have.
func attackAt(ctx context.Context, base string, rps float64, warm, d, deadline time.Duration, tenants int) Step {
	atk := vegeta.NewAttacker(
		vegeta.Timeout(deadline),
		vegeta.KeepAlive(true),
		vegeta.Workers(64),
		vegeta.MaxWorkers(20000),
		vegeta.Connections(20000),
		vegeta.Redirects(vegeta.NoFollow),
	)
	rate := vegeta.ConstantPacer{Freq: int(rps + 0.5), Per: time.Second}
	var useful, late, errored, offered int64
	var work time.Duration // the upstream's, for useful answers
	byClass := map[string]int64{}
	rejected := map[string]int64{}
	var lat []time.Duration
	begin := time.Now().Add(warm)
	res := atk.Attack(mixTarget(base, tenants, deadline), rate, warm+d, "step")
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	for r := range res {
		if r.Timestamp.Before(begin) {
			continue // the warm-up
		}
		offered++
		switch {
		case r.Code == http.StatusOK && r.Latency <= deadline:
			useful++
			byClass[classOf(r.Method, r.URL)]++
			lat = append(lat, r.Latency)
			if r.Timestamp.Add(r.Latency).Sub(begin) <= d { // done within the step: work of its d seconds
				us, _ := strconv.ParseInt(r.Headers.Get(WorkHeader), 10, 64)
				work += time.Duration(us) * time.Microsecond
			}
		case r.Code == http.StatusOK || r.Code == 0 && isTimeout(r.Error):
			late++
			lat = append(lat, deadline) // censored: the caller stopped waiting
		case r.Code == http.StatusTooManyRequests || r.Code == http.StatusServiceUnavailable || r.Code == http.StatusBadRequest:
			rejected[reasonOf(r.Body, int(r.Code))]++
		default:
			errored++
		}
	}
	secs := d.Seconds()
	st := Step{
		OfferedRPS:  float64(offered) / secs,
		GoodputRPS:  float64(useful) / secs,
		UsefulWork:  work.Seconds() / secs,
		LateRPS:     float64(late) / secs,
		ErroredRPS:  float64(errored) / secs,
		RejectedRPS: map[string]float64{},
	}
	st.GoodputByClass = map[string]float64{}
	for k, v := range byClass {
		st.GoodputByClass[k] = float64(v) / secs
	}
	var rej int64
	for k, v := range rejected {
		st.RejectedRPS[k] = float64(v) / secs
		rej += v
	}
	st.AdmittedRPS = float64(offered-rej) / secs
	if len(lat) > 0 {
		slices.Sort(lat)
		st.P50Ms = float64(lat[len(lat)/2]) / 1e6
		st.P99Ms = float64(lat[min(len(lat)*99/100, len(lat)-1)]) / 1e6
	}
	return st
}

// classOf is the class examples/routes-api.yaml gives a request of the mix.
func classOf(method, url string) string {
	switch {
	case strings.Contains(url, "/v1/analytics/"):
		return "sheddable"
	case method == http.MethodPost:
		return "critical"
	}
	return "default"
}

func isTimeout(msg string) bool {
	return bytes.Contains([]byte(msg), []byte("Timeout")) || bytes.Contains([]byte(msg), []byte("deadline exceeded"))
}

// reasonOf reads the envelope's reason, falling back to the status.
func reasonOf(body []byte, code int) string {
	const key = `"reason":"`
	if i := bytes.Index(body, []byte(key)); i >= 0 {
		rest := body[i+len(key):]
		if j := bytes.IndexByte(rest, '"'); j > 0 {
			return string(rest[:j])
		}
	}
	return strconv.Itoa(code)
}

// measureCapacity drives the upstream at saturation with a closed loop of
// 4 callers per worker for d and returns completions per second and the
// worker time they took per second (in workers).
func measureCapacity(ctx context.Context, base string, workers int, d time.Duration) (rps, work float64) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * workers}}
	defer client.CloseIdleConnections()
	tgt := mixTarget(base, 1, time.Minute)
	var done, workUs atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 * workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var t vegeta.Target
				tgt(&t)
				req, _ := http.NewRequestWithContext(ctx, t.Method, t.URL, nil)
				req.Header = t.Header
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && ctx.Err() == nil {
					done.Add(1)
					us, _ := strconv.ParseInt(resp.Header.Get(WorkHeader), 10, 64)
					workUs.Add(us)
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	return float64(done.Load()) / secs, float64(workUs.Load()) / 1e6 / secs
}

func fmtReasons(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%.0f", k, m[k])
	}
	return b.String()
}
