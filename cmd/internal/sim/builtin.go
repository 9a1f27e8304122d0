package sim

import (
	"slices"
	"time"
)

// Mercury is sluice's reference overload model: a downstream of 4,000 work
// units/s (40 workers, 10 ms of worker time per unit, exponential service
// times), premium queries of 3 units and free queries of 1 unit in fixed
// proportions (1,000 and 6,000 req/s at 9,000 units/s), behind an
// unbounded FIFO queue, swept over 4k, 5k, 8k and 10k units/s offered.
//
// How its parameters were chosen: capacity, costs and the mix are fixed
// reference numbers. The clients are ordinary ones, set before looking at the curve:
// each attempt waits between 0.25 s and 1.25 s (uniform across callers),
// a failed attempt is retried up to 3 attempts in all with exponential
// backoff from 200 ms and full jitter, under a retry budget of 5% (a
// client-side retry throttle). One parameter was fitted, once, to the
// four reference points together: the service notices that a caller has gone
// only at its first cancellation checkpoint, 30% into the work
// (CancelPoint 0.3). Everything else follows from the mechanisms: a queue
// that keeps growing until callers give up, the 30% of every abandoned
// request that is wasted, work that finishes after its caller left, and
// retries that add load exactly when the service is slowest.
var Mercury = Scenario{
	Name:        "mercury",
	Description: "Mercury overload model: 4,000 units/s, premium (3 units) and free (1 unit) queries, naive FIFO service",
	Unit:        "units",
	Capacity:    4000,
	Workers:     40,
	Server:      Server{CancelPoint: 0.3, Service: "exponential"},
	Client: Client{
		Timeout:  Dist{Kind: "uniform", Min: 250 * time.Millisecond, Max: 1250 * time.Millisecond},
		Attempts: 3,
		Backoff:  200 * time.Millisecond,
		Budget:   0.05,
	},
	Classes: []Class{
		{Name: "premium", Path: "/premium/query", Units: 3, Share: 3000, Tenants: 20},
		{Name: "free", Path: "/free/query", Units: 1, Share: 6000, Tenants: 100},
	},
	Loads:         []float64{4000, 5000, 8000, 10000},
	Step:          60 * time.Second,
	Warmup:        10 * time.Second,
	Policy:        "mercury",
	Reference:     []Point{{4000, 3900}, {5000, 3700}, {8000, 1900}, {10000, 1200}},
	ReferenceName: "published Mercury model",
}

// RoutesAPI is the upstream of `sluice demo` as a model: 8 workers, the
// demo's routes and service times (reads 10 ms, route solves 22–78 ms,
// analytics 150 ms; about 200 req/s of capacity), an unbounded FIFO queue
// that never drops work, callers that wait 500 ms and never retry, and an
// evenly spaced load as the demo's load generator sends. Its sweep is the
// demo's: 0.5× to 10× capacity.
var RoutesAPI = Scenario{
	Name:        "routes-api",
	Description: "the sluice demo's modeled upstream: 8 workers, reads, route solves and analytics",
	Unit:        "req",
	Workers:     8,
	Client: Client{
		Timeout:  Const(500 * time.Millisecond),
		Attempts: 1,
		Arrivals: "uniform",
	},
	Classes: []Class{
		{Name: "read", Method: "GET", Path: "/v1/routes/42", Share: 50, Tenants: 40, Service: Const(10 * time.Millisecond)},
		{Name: "solve", Method: "POST", Path: "/v1/routes", Headers: map[string]string{"X-Stops": "150"}, Share: 40, Tenants: 40,
			Service: Dist{Kind: "uniform", Min: 22 * time.Millisecond, Max: 78 * time.Millisecond}},
		{Name: "analytics", Method: "GET", Path: "/v1/analytics/daily", Share: 10, Tenants: 40, Service: Const(150 * time.Millisecond)},
	},
	Loads:  []float64{100, 200, 400, 1000, 2000},
	Step:   60 * time.Second,
	Warmup: 10 * time.Second,
	Policy: "routes-api",
}

// LoadStep is a time series on the routes-api model for the protection
// gates: 30 s at half capacity, 40 s at three times capacity, then half
// capacity again, with the degradation ladder's policy.
var LoadStep = func() Scenario {
	s := RoutesAPI
	s.Name = "load-step"
	s.Description = "routes-api: half capacity, a 3x load step for 40 s, then half capacity"
	s.Loads = nil
	s.Reference, s.ReferenceName = nil, ""
	s.Phases = []Phase{{At: 0, Load: 100}, {At: 30 * time.Second, Load: 600}, {At: 70 * time.Second, Load: 100}}
	s.Length = 120 * time.Second
	s.Interval = 2 * time.Second
	s.Policy = "routes-api-shedding"
	return s
}()

// Slowdown is a time series on the Mercury model: steady load at 75% of
// capacity while the downstream's service times double for 30 s (a slow
// dependency), which halves capacity.
var Slowdown = func() Scenario {
	s := Mercury
	s.Name = "slowdown"
	s.Description = "mercury at 3,000 units/s; service times double from 20 s to 50 s"
	s.Loads = nil
	s.Phases = []Phase{{At: 0, Load: 3000}, {At: 20 * time.Second, Load: 3000, Slowdown: 2}, {At: 50 * time.Second, Load: 3000}}
	s.Length = 80 * time.Second
	s.Interval = 2 * time.Second
	s.Reference, s.ReferenceName = nil, ""
	return s
}()

// Dependency is a time series on the routes-api model: steady load at
// 80% of capacity while the route solver's dependency (a map service)
// answers 4× slower for 40 s; reads and analytics do not call it. With
// the degradation policy the protection gates keep the critical route
// solves and shed by tier.
var Dependency = func() Scenario {
	s := RoutesAPI
	s.Name = "dependency"
	s.Description = "routes-api at 160 req/s; route solves' dependency 4x slower from 20 s to 60 s"
	s.Loads = nil
	s.Phases = []Phase{{At: 0, Load: 160}, {At: 20 * time.Second, Load: 160, Slowdown: 4, Classes: []string{"solve"}}, {At: 60 * time.Second, Load: 160}}
	s.Length = 100 * time.Second
	s.Interval = 2 * time.Second
	s.Policy = "routes-api-shedding"
	return s
}()

// ServiceStep is a time series on the routes-api workers for the adaptive
// limit: reads of 5 ms mean (capacity 1,600 req/s) offered at 960 req/s,
// three times the capacity of 25 ms reads, while service times step to
// 25 ms for 30 s (capacity 320 req/s) and back. The limit must follow.
var ServiceStep = Scenario{
	Name:        "service-step",
	Description: "routes-api workers: 5 ms reads at 960 req/s; service times 25 ms (3x overload) from 30 s to 60 s",
	Unit:        "req",
	Workers:     8,
	Client:      Client{Timeout: Const(500 * time.Millisecond), Attempts: 1, Arrivals: "poisson"},
	Classes: []Class{
		{Name: "read", Method: "GET", Path: "/v1/routes/42", Share: 1, Tenants: 40,
			Service: Dist{Kind: "lognormal", Mean: 5 * time.Millisecond, CV: 0.5}},
	},
	Phases:   []Phase{{At: 0, Load: 960}, {At: 30 * time.Second, Load: 960, Slowdown: 5}, {At: 60 * time.Second, Load: 960}},
	Length:   90 * time.Second,
	Interval: time.Second,
	Policy:   "routes-api",
}

// Reservation is a time series on the Mercury model for the class
// reservations of examples/mercury.yaml: the reference offered mix (premium
// 1,000 queries/s of 3 units, free 6,000/s of 1 unit) for 20 s, premium
// down to 400 queries/s for 20 s (free may borrow what it leaves), then
// premium back (its reserve must come back within the revocation time).
var Reservation = func() Scenario {
	s := Mercury
	s.Name = "reservation"
	s.Description = "mercury's mix at 9,000 units/s; premium drops to 400 queries/s from 20 s to 40 s"
	s.Loads = nil
	s.Reference, s.ReferenceName = nil, ""
	s.Phases = []Phase{{At: 0, Load: 9000}, {At: 20 * time.Second, Load: 7200, Shares: map[string]float64{"premium": 1200, "free": 6000}},
		{At: 40 * time.Second, Load: 9000}}
	s.Length = 60 * time.Second
	s.Interval = time.Second
	return s
}()

// LeaseFleet is a time series of four gateway processes in front of one
// API, for the leased rate of examples/lease-fleet.yaml (1,000 req/s across
// the fleet, 5 s leases refreshed every 1.25 s). The API has 2,000 req/s of
// capacity (16 workers, 8 ms mean); the fleet is offered three times the
// rate, spread 4:3:2:1 over the processes (1,200, 900, 600 and 300 req/s,
// each above its fair share of 250). From 20 s to 40 s process-4 receives
// nothing and the others' load is unchanged (its share must go to them
// within about a lease time); from 40 s it is back at 150 req/s, below its
// fair share, which it must get in full while the others split the rest.
var LeaseFleet = Scenario{
	Name:        "lease-fleet",
	Description: "4 gateways at 4:3:2:1 share a leased 1,000 req/s at 3x; process-4 stops from 20 s to 40 s, then sends 150 req/s",
	Unit:        "req",
	Workers:     16,
	Client:      Client{Timeout: Const(time.Second), Attempts: 3, Backoff: 200 * time.Millisecond, Budget: 0.05},
	Classes: []Class{
		{Name: "api", Method: "GET", Path: "/v1/items", Share: 1, Tenants: 50, Service: Dist{Kind: "exponential", Mean: 8 * time.Millisecond}},
	},
	Processes: 4,
	Balance:   []float64{4, 3, 2, 1},
	Phases: []Phase{{At: 0, Load: 3000}, {At: 20 * time.Second, Load: 2700, Balance: []float64{4, 3, 2, 0}},
		{At: 40 * time.Second, Load: 2850, Balance: []float64{4, 3, 2, 0.5}}},
	Length:   60 * time.Second,
	Interval: time.Second,
	Policy:   "lease-fleet",
}

// RetryStorm is the Mercury model with callers that retry hard: up to 5
// attempts on timeouts and on refusals, after 50 ms of backoff, without a
// retry budget ("naive"), swept over the same loads. With client retry
// "sluice" (sluice sim --scenario retry-storm --retry sluice) the same
// callers go through package client's retry budget, adaptive throttle and
// jittered Retry-After floors.
var RetryStorm = func() Scenario {
	s := Mercury
	s.Name = "retry-storm"
	s.Description = "mercury with callers retrying up to 5 attempts on timeouts and refusals, 50 ms backoff, no budget"
	s.Client.Attempts = 5
	s.Client.Backoff = 50 * time.Millisecond
	s.Client.BackoffMax = time.Second
	s.Client.Budget = 0
	s.Client.RetryOn = []string{"timeout", "overload", "policy"}
	s.Client.Retry = RetryNaive
	s.Step = 30 * time.Second
	s.Reference, s.ReferenceName = nil, ""
	return s
}()

var builtins = []*Scenario{&Mercury, &RoutesAPI, &LoadStep, &Slowdown, &Dependency, &ServiceStep, &Reservation, &LeaseFleet, &RetryStorm}

// Builtin returns the built-in scenario named name.
func Builtin(name string) (Scenario, bool) {
	i := slices.IndexFunc(builtins, func(s *Scenario) bool { return s.Name == name })
	if i < 0 {
		return Scenario{}, false
	}
	s := *builtins[i]
	s.Classes = slices.Clone(s.Classes)
	s.Phases = slices.Clone(s.Phases)
	for i := range s.Phases {
		s.Phases[i].Classes = slices.Clone(s.Phases[i].Classes)
		s.Phases[i].Balance = slices.Clone(s.Phases[i].Balance)
	}
	s.Balance = slices.Clone(s.Balance)
	s.Client.RetryOn = slices.Clone(s.Client.RetryOn)
	s.Loads = slices.Clone(s.Loads)
	s.Reference = slices.Clone(s.Reference)
	return s, true
}

// Builtins lists the built-in scenario names.
func Builtins() []string {
	names := make([]string, len(builtins))
	for i, s := range builtins {
		names[i] = s.Name
	}
	return names
}
