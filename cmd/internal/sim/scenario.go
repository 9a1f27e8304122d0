package sim

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Scenario is a modeled service and its clients: what `sluice sim` runs.
// Durations are simulated time; loads and capacity are in work units per
// second (Unit names them).
type Scenario struct {
	// Name identifies the scenario in reports.
	Name string
	// Description says what the scenario models, in one line.
	Description string
	// Unit names the work unit, e.g. "units" or "req" (default "units").
	Unit string
	// Capacity is the service's capacity in units/s. Classes without an
	// explicit Service take Units × Workers ÷ Capacity seconds of a worker.
	Capacity float64
	// Workers is the size of the worker pool: each worker serves one
	// request at a time. Required.
	Workers int
	// Server is how the service treats callers that gave up.
	Server Server
	// Client is how callers time out and retry.
	Client Client
	// Classes is the request mix. Required.
	Classes []Class
	// Processes is how many gateway processes stand in front of the one
	// service (default: the length of Balance, else 1; at most 64). With a
	// policy each runs its own chain built from it, named process-1,
	// process-2, ...: the budget of a gate with lease: is shared by all of
	// them through one allocator, while every other gate counts for its
	// process alone, as on the memory backend in a real fleet. The worker
	// pool and its queue stay one service behind them.
	Processes int
	// Balance spreads the load over the processes: a weight per process
	// (weights are normalized; 0: the process receives nothing), empty:
	// evenly. Every attempt, a retry included, goes to a process drawn by
	// the weights, as a load balancer would send it.
	Balance []float64
	// Loads are the offered loads of a sweep, in units/s of first attempts.
	Loads []float64
	// Step is the simulated length of one sweep step (default 60 s), and
	// Warmup its unmeasured beginning (default 10 s for steps of 20 s or
	// more, none for shorter ones; 0s in a file, or negative in Go: none).
	Step, Warmup time.Duration
	// Phases, when set, make a single time series instead of a sweep: the
	// load (and slowdown) of each phase holds from its At until the next.
	Phases []Phase
	// Length is the simulated length of a time series (default: the last
	// phase's At plus 30 s), Interval its row length (default 1 s).
	Length, Interval time.Duration
	// Seed makes a run reproducible bit for bit (default 1).
	Seed uint64
	// Policy names the policy the "with admission" run uses when none is
	// given: a built-in example ("mercury", "routes-api", ...) or a path.
	Policy string
	// Reference is a published curve to compare the run without admission
	// with: goodput at offered loads (e.g. the published Mercury model), named
	// ReferenceName. Reports print the deviation; the plot shows the points.
	Reference     []Point
	ReferenceName string
}

// Point is an (offered, goodput) pair in units/s.
type Point struct {
	Offered float64 `json:"offered"`
	Goodput float64 `json:"goodput"`
}

// Server is the service's behaviour toward abandoned work. The defaults
// (zero value) are the naive service: no check when a worker takes a
// request, and work whose caller has gone runs to completion.
type Server struct {
	// CheckQueue makes a worker skip requests whose caller has already
	// gone when it takes them from the queue (a context check at dequeue),
	// paying ScanCost of worker time for each one skipped.
	CheckQueue bool
	ScanCost   time.Duration
	// CancelPoint is the fraction of a request's service time after which
	// the service notices that the caller has gone (its first cancellation
	// checkpoint, e.g. after parsing, authentication and the first
	// downstream call) and abandons the work. 0 or ≥ 1: never noticed, the
	// work runs to completion and answers late.
	CancelPoint float64
	// Service is the shape of service times for classes that take theirs
	// from Capacity: "exponential" (default), "constant" or "lognormal"
	// with ServiceCV.
	Service   string
	ServiceCV float64
	// ReleaseAtDeadline models a gateway that frees an admitted request's
	// slot when its caller's deadline passes, answering 504 and counting
	// it errored, while the service works on (sluice proxy until it held
	// the slot to the upstream's answer): the gates never learn that the
	// work came late, and admit work the service cannot start.
	ReleaseAtDeadline bool
}

// Client is the callers' policy. The zero value waits 1 s per attempt and
// never retries.
type Client struct {
	// Timeout is how long a caller waits for one attempt (default 1 s).
	Timeout Dist
	// Attempts is the most attempts per operation, the first included
	// (default 1: no retries).
	Attempts int
	// Backoff is the base of the exponential backoff before a retry, with
	// full jitter: attempt n+1 waits uniform [0, Backoff·2^(n-1)), capped
	// at BackoffMax (default 100 ms and 10 s).
	Backoff, BackoffMax time.Duration
	// Budget limits retries to this many per first attempt over time, as a
	// retry budget (gRPC retry throttling, Finagle RetryBudget): every
	// first attempt deposits Budget tokens (at most 100 saved), every retry
	// spends one. 0: no budget, Attempts alone limits retries.
	Budget float64
	// RetryOn lists what a caller retries: "timeout", "overload" (503),
	// "policy" (429) (default all three). Rejections marked not retryable
	// are never retried.
	RetryOn []string
	// IgnoreRetryAfter makes callers retry on their backoff alone; by
	// default they wait at least the Retry-After they are given (in whole
	// seconds with sluice's jitter, as an HTTP client sees it).
	IgnoreRetryAfter bool
	// Arrivals is the arrival process of first attempts: "poisson"
	// (default) or "uniform" (evenly spaced, as a constant-rate load
	// generator sends).
	Arrivals string
	// Retry is the callers' retry policy: "naive" (default: the fields
	// above alone) or "sluice", package client's Retrier on the virtual
	// clock: full-jitter backoff and the Retry-After as a floor jittered
	// upward (client.Floor, spread 1), a retry budget of Budget retries
	// per request (default 0.1, a burst of 10), the adaptive throttle
	// (K = 2 over 2 minutes, from 10 requests), and timeouts retried only
	// for idempotent methods (a refusal sluice says had no effect is
	// retried for any). Attempts and RetryOn still bound what is retried.
	Retry string
	// Clients is how many client processes the callers' operations are
	// spread over by tenant, each with its own budget and throttle
	// (default 1); only with Retry "sluice".
	Clients int
	// Deadline is each operation's whole time budget from its first
	// attempt (default none: each attempt has its Timeout alone). A caller
	// waits for an attempt until the earlier of its Timeout and the
	// deadline, and starts no retry after the deadline. The budget an
	// attempt tells the server (the policy's deadline header): naive
	// callers send the first attempt's again on every retry, as an HTTP
	// client resending the same header does; "sluice" callers send the
	// time left.
	Deadline time.Duration
}

// Class is one kind of request in the mix.
type Class struct {
	// Name labels the class in reports and its tenants ("free-17").
	Name string
	// Method, Path and Headers describe the request to the policy's route
	// rules, which give its sluice class, operation and cost.
	Method, Path string
	Headers      map[string]string
	// Units is the request's true demand in work units (default 1): what
	// offered load and goodput count, and what sizes its service time.
	Units int64
	// Share is the class's share of the offered units (shares are
	// normalized to sum to 1).
	Share float64
	// Tenants is how many callers send this class, chosen uniformly
	// (default 1).
	Tenants int
	// Service is the worker time of one request; zero: Units × Workers ÷
	// Capacity with the server's service shape.
	Service Dist
	// Timeout overrides the client's per-attempt timeout for this class.
	Timeout Dist
}

// Phase is one part of a time series.
type Phase struct {
	// At is when the phase begins.
	At time.Duration
	// Load is the offered load in units/s of first attempts.
	Load float64
	// Slowdown multiplies the service times that start in the phase (a
	// service-time step, or a slow dependency); 0 means 1.
	Slowdown float64
	// Classes limits the slowdown to these classes (the ones that call the
	// slow dependency); empty: every class.
	Classes []string
	// Shares replaces the classes' shares of Load in the phase, by class
	// name (normalized; a class not named offers nothing); empty: the
	// scenario's shares.
	Shares map[string]float64
	// Balance replaces the processes' weights in the phase, one per
	// process (0: the process receives nothing in the phase, as when a
	// load balancer takes it out); empty: the scenario's Balance. Load
	// stays the whole fleet's load, so lower Load with it to stop one
	// process's traffic without moving it to the others.
	Balance []float64
	// Workers changes the size of the worker pool from the phase on (a
	// service that lost or gained instances); 0: the scenario's Workers.
	// A pool that shrinks lets its busy workers finish first.
	Workers int
	// Down lists the processes (1 for the first) that cannot reach the
	// service in the phase: what they admit fails at once (a 502 to the
	// caller, which retries it as an overload refusal), and their gates
	// see errored work. The balancer still sends them their share.
	Down []int
}

// Dist is a distribution of durations. Kinds: "constant" (Mean),
// "exponential" (Mean), "lognormal" (Mean, CV), "uniform" and "loguniform"
// (Min, Max). The zero value is unset.
type Dist struct {
	// Kind is the distribution: constant, exponential, lognormal, uniform
	// or loguniform.
	Kind string
	// Mean is the mean of constant, exponential and lognormal.
	Mean time.Duration
	// CV is lognormal's coefficient of variation (standard deviation ÷
	// mean), in [0, 10].
	CV float64
	// Min and Max bound uniform and loguniform.
	Min, Max time.Duration
}

// Const is a constant duration.
func Const(d time.Duration) Dist { return Dist{Kind: "constant", Mean: d} }

func (d Dist) isZero() bool { return d.Kind == "" }

// mean returns the distribution's mean in seconds.
func (d Dist) mean() float64 {
	switch d.Kind {
	case "uniform":
		return (d.Min + d.Max).Seconds() / 2
	case "loguniform":
		lo, hi := d.Min.Seconds(), d.Max.Seconds()
		if hi == lo {
			return lo
		}
		return (hi - lo) / math.Log(hi/lo)
	}
	return d.Mean.Seconds()
}

func (d Dist) validate() error {
	switch d.Kind {
	case "constant", "exponential":
		if d.Mean <= 0 {
			return fmt.Errorf("%s: mean %v, want > 0", d.Kind, d.Mean)
		}
	case "lognormal":
		if d.Mean <= 0 || !(d.CV > 0) || d.CV > 10 {
			return fmt.Errorf("lognormal: mean %v and cv %v, want mean > 0 and cv in (0, 10]", d.Mean, d.CV)
		}
	case "uniform", "loguniform":
		if d.Min <= 0 || d.Max < d.Min {
			return fmt.Errorf("%s: [%v, %v], want 0 < min ≤ max", d.Kind, d.Min, d.Max)
		}
	default:
		return fmt.Errorf("unknown distribution %q (want constant, exponential, lognormal, uniform or loguniform)", d.Kind)
	}
	return nil
}

// Limits that keep a run inside memory and int64 nanoseconds.
const (
	maxLoad    = 1e7 // units/s
	maxWorkers = 1 << 20
	maxLength  = 24 * time.Hour
	// maxRequests bounds the first attempts of one sweep step or one time
	// series (e.g. 10,000 req/s for 2,000 s): the queue of a naive service
	// can hold most of them, so this bounds memory (about 100 bytes each).
	maxRequests = 2e7
	// maxRows bounds the rows of a time series.
	maxRows = 100_000
	// maxTenants bounds the tenants of all classes together.
	maxTenants = 1 << 20
	// maxProcesses bounds the simulated gateway processes (an attempt
	// keeps its process in a byte; a report prints a column group each).
	maxProcesses = 64
)

// FieldError is a scenario error naming the field at fault (e.g.
// "classes[1].share"). ParseScenario turns it into an error with the
// file and line of that field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func ferr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// withDefaults returns a copy of s with defaults filled in, or the first
// invalid field. Each part of the scenario is checked by its own step, in
// the order of the fields.
func (s Scenario) withDefaults() (Scenario, error) {
	if s.Unit == "" {
		s.Unit = "units"
	}
	if s.Workers < 1 || s.Workers > maxWorkers {
		return s, ferr("workers", "%d, want 1 to %d", s.Workers, maxWorkers)
	}
	if s.Capacity < 0 || math.IsNaN(s.Capacity) || s.Capacity > maxLoad {
		return s, ferr("capacity", "%v, want a number of units/s in [0, %g]", s.Capacity, float64(maxLoad))
	}
	s.Classes = append([]Class(nil), s.Classes...)
	s.Phases = append([]Phase(nil), s.Phases...)
	s.Balance = slices.Clone(s.Balance)
	for _, step := range []func(*Scenario) error{(*Scenario).server, (*Scenario).client, (*Scenario).classes, (*Scenario).fleet, (*Scenario).sweep, (*Scenario).series} {
		if err := step(&s); err != nil {
			return s, err
		}
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	return s, nil
}

func (s *Scenario) server() error {
	if s.Server.CancelPoint < 0 || math.IsNaN(s.Server.CancelPoint) {
		return ferr("server.cancel_point", "%v, want a fraction ≥ 0", s.Server.CancelPoint)
	}
	if s.Server.ScanCost < 0 {
		return ferr("server.scan_cost", "%v, want ≥ 0", s.Server.ScanCost)
	}
	switch s.Server.Service {
	case "":
		s.Server.Service = "exponential"
	case "exponential", "constant":
	case "lognormal":
		if !(s.Server.ServiceCV > 0) || s.Server.ServiceCV > 10 {
			return ferr("server.service_cv", "%v, want a coefficient of variation in (0, 10]", s.Server.ServiceCV)
		}
	default:
		return ferr("server.service", "%q, want exponential, constant or lognormal", s.Server.Service)
	}
	return nil
}

func (s *Scenario) client() error {
	c := &s.Client
	if c.Timeout.isZero() {
		c.Timeout = Const(time.Second)
	}
	if err := c.Timeout.validate(); err != nil {
		return ferr("client.timeout", "%v", err)
	}
	if c.Attempts == 0 {
		c.Attempts = 1
	}
	if c.Attempts < 1 || c.Attempts > 100 {
		return ferr("client.attempts", "%d, want 1 to 100", c.Attempts)
	}
	if c.Backoff == 0 {
		c.Backoff = 100 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 10 * time.Second
	}
	if c.Backoff < 0 || c.BackoffMax < c.Backoff {
		return ferr("client.backoff", "base %v, max %v: want 0 < base ≤ max", c.Backoff, c.BackoffMax)
	}
	if c.Budget < 0 || math.IsNaN(c.Budget) || c.Budget > 100 {
		return ferr("client.budget", "%v, want retries per request in [0, 100]", c.Budget)
	}
	return c.choices()
}

// choices fills in and checks the client's named choices.
func (c *Client) choices() error {
	if c.RetryOn == nil {
		c.RetryOn = []string{"timeout", "overload", "policy"}
	}
	for _, r := range c.RetryOn {
		if r != "timeout" && r != "overload" && r != "policy" {
			return ferr("client.retry_on", "%q, want timeout, overload or policy", r)
		}
	}
	switch c.Arrivals {
	case "":
		c.Arrivals = "poisson"
	case "poisson", "uniform":
	default:
		return ferr("client.arrivals", "%q, want poisson or uniform", c.Arrivals)
	}
	switch c.Retry {
	case "":
		c.Retry = RetryNaive
	case RetryNaive, RetrySluice:
	default:
		return ferr("client.retry", "%q, want naive or sluice", c.Retry)
	}
	if c.Clients == 0 {
		c.Clients = 1
	}
	if c.Clients < 1 || c.Clients > maxClients {
		return ferr("client.clients", "%d, want 1 to %d", c.Clients, maxClients)
	}
	return nil
}

// The client retry policies (Client.Retry).
const (
	RetryNaive  = "naive"
	RetrySluice = "sluice"
)

// maxClients bounds Client.Clients (each holds a throttle's window).
const maxClients = 100_000

func (s *Scenario) classes() error {
	if len(s.Classes) == 0 {
		return ferr("classes", "none, want at least one request class")
	}
	total, tenants := 0.0, 0
	names := map[string]bool{}
	for i := range s.Classes {
		cl := &s.Classes[i]
		if err := s.class(i, cl, names); err != nil {
			return err
		}
		total += cl.Share
		tenants += cl.Tenants
		if tenants > maxTenants {
			return ferr(fmt.Sprintf("classes[%d].tenants", i), "%d tenants in all classes up to this one; at most %d", tenants, maxTenants)
		}
	}
	for i := range s.Classes {
		s.Classes[i].Share /= total
	}
	return nil
}

// class fills in and checks class i.
func (s *Scenario) class(i int, cl *Class, names map[string]bool) error {
	f := fmt.Sprintf("classes[%d]", i)
	if cl.Name == "" {
		return ferr(f+".name", "missing")
	}
	if names[cl.Name] {
		return ferr(f+".name", "duplicate class %q", cl.Name)
	}
	names[cl.Name] = true
	if cl.Method == "" {
		cl.Method = "GET"
	}
	if cl.Path == "" {
		cl.Path = "/" + cl.Name
	}
	if cl.Path[0] != '/' {
		return ferr(f+".path", "%q must start with /", cl.Path)
	}
	if cl.Units == 0 {
		cl.Units = 1
	}
	if cl.Units < 1 || cl.Units > 1<<20 {
		return ferr(f+".units", "%d, want 1 to %d", cl.Units, 1<<20)
	}
	if cl.Share == 0 {
		return ferr(f+".share", "missing: the class's part of the load, a number > 0")
	}
	if !(cl.Share > 0) || cl.Share > 1e6 {
		return ferr(f+".share", "%v, want > 0 and ≤ 1e6", cl.Share)
	}
	if cl.Tenants == 0 {
		cl.Tenants = 1
	}
	if cl.Tenants < 1 || cl.Tenants > maxTenants {
		return ferr(f+".tenants", "%d, want 1 to %d", cl.Tenants, maxTenants)
	}
	return s.classTimes(i, cl)
}

// classTimes fills in and checks class i's service time and timeout.
func (s *Scenario) classTimes(i int, cl *Class) error {
	f := fmt.Sprintf("classes[%d]", i)
	if cl.Service.isZero() {
		if s.Capacity == 0 {
			return ferr("capacity", "0, and class %s has no service time: want a capacity to derive it from, or classes[%d].service", cl.Name, i)
		}
		mean := time.Duration(float64(cl.Units) * float64(s.Workers) / s.Capacity * 1e9)
		if mean < 1 {
			return ferr("capacity", "%v units/s with %d workers gives a service time below 1 ns", s.Capacity, s.Workers)
		}
		cl.Service = Dist{Kind: s.Server.Service, Mean: mean, CV: s.Server.ServiceCV}
	}
	if err := cl.Service.validate(); err != nil {
		return ferr(f+".service", "%v", err)
	}
	if !cl.Timeout.isZero() {
		if err := cl.Timeout.validate(); err != nil {
			return ferr(f+".timeout", "%v", err)
		}
	}
	return nil
}

// fleet fills in and checks the processes and their balance.
func (s *Scenario) fleet() error {
	if s.Processes == 0 {
		s.Processes = max(len(s.Balance), 1)
	}
	if s.Processes < 1 || s.Processes > maxProcesses {
		return ferr("processes", "%d, want 1 to %d", s.Processes, maxProcesses)
	}
	return s.balance("balance", s.Balance)
}

// balance checks a list of process weights at field f: empty, or one
// weight in [0, 1e6] per process, not all 0.
func (s *Scenario) balance(f string, w []float64) error {
	if len(w) == 0 {
		return nil
	}
	if len(w) != s.Processes {
		return ferr(f, "%d weights for %d processes, want one per process", len(w), s.Processes)
	}
	total := 0.0
	for i, v := range w {
		if !(v >= 0) || v > 1e6 {
			return ferr(fmt.Sprintf("%s[%d]", f, i), "%v, want a weight in [0, 1e6]", v)
		}
		total += v
	}
	if total == 0 {
		return ferr(f, "all weights are 0")
	}
	return nil
}

// perUnit is the requests per unit of load and second, for the work bound.
func (s *Scenario) perUnit() float64 {
	n := 0.0
	for _, cl := range s.Classes {
		n += cl.Share / float64(cl.Units)
	}
	return n
}

// sweep fills in and checks the step and the loads of a sweep.
func (s *Scenario) sweep() error {
	if s.Step == 0 {
		s.Step = 60 * time.Second
	}
	switch {
	case s.Warmup < 0:
		s.Warmup = 0
	case s.Warmup == 0 && s.Step >= 20*time.Second:
		s.Warmup = 10 * time.Second
	}
	if s.Step <= 0 || s.Step > maxLength || s.Warmup < 0 || s.Warmup >= s.Step {
		return ferr("step", "step %v with warmup %v: want 0 ≤ warmup < step ≤ %v", s.Step, s.Warmup, maxLength)
	}
	if len(s.Loads) > 0 && len(s.Phases) > 0 {
		return ferr("phases", "both loads (a sweep) and phases (a time series) are set: want one of them")
	}
	if len(s.Loads) == 0 && len(s.Phases) == 0 {
		return ferr("loads", "none, and no phases: want a sweep (loads) or a time series (phases)")
	}
	for i, l := range s.Loads {
		if !(l > 0) || l > maxLoad {
			return ferr(fmt.Sprintf("loads[%d]", i), "%v, want units/s in (0, %g]", l, float64(maxLoad))
		}
		if n := l * s.perUnit() * s.Step.Seconds(); n > maxRequests {
			return ferr(fmt.Sprintf("loads[%d]", i), "%g %s/s for a %v step is %.3g requests; the simulator takes at most %g per step: shorten the step or lower the load",
				l, s.Unit, s.Step, n, float64(maxRequests))
		}
	}
	return nil
}

// series fills in and checks the phases, length and interval of a time
// series.
func (s *Scenario) series() error {
	if len(s.Phases) == 0 {
		return nil
	}
	var last time.Duration
	for i := range s.Phases {
		if err := s.phase(i, &last); err != nil {
			return err
		}
	}
	if s.Length == 0 {
		s.Length = last + 30*time.Second
	}
	if s.Interval == 0 {
		s.Interval = time.Second
	}
	if s.Length <= last || s.Length > maxLength || s.Interval <= 0 || s.Interval > s.Length {
		return ferr("length", "length %v, interval %v: want the last phase inside the length, ≤ %v, and 0 < interval ≤ length", s.Length, s.Interval, maxLength)
	}
	if rows := s.Length / s.Interval; rows > maxRows {
		return ferr("interval", "%v over a length of %v is %d rows; at most %d", s.Interval, s.Length, rows, maxRows)
	}
	n := 0.0
	for i, p := range s.Phases {
		end := s.Length
		if i+1 < len(s.Phases) {
			end = s.Phases[i+1].At
		}
		n += p.Load * s.perUnit() * (end - p.At).Seconds()
	}
	if n > maxRequests {
		return ferr("phases", "%.3g requests over the series; the simulator takes at most %g: shorten the length or lower the loads", n, float64(maxRequests))
	}
	return nil
}

// phase fills in and checks phase i, which starts at or after *last.
func (s *Scenario) phase(i int, last *time.Duration) error {
	p := &s.Phases[i]
	f := fmt.Sprintf("phases[%d]", i)
	if p.At < *last || (i == 0 && p.At != 0) {
		return ferr(f+".at", "%v: phases start at 0 and go forward in time", p.At)
	}
	*last = p.At
	if p.Load < 0 || math.IsNaN(p.Load) || p.Load > maxLoad {
		return ferr(f+".load", "%v, want units/s in [0, %g]", p.Load, float64(maxLoad))
	}
	if p.Slowdown == 0 {
		p.Slowdown = 1
	}
	if !(p.Slowdown > 0) || p.Slowdown > 1000 {
		return ferr(f+".slowdown", "%v, want a factor in (0, 1000]", p.Slowdown)
	}
	if err := s.phaseClasses(p, f); err != nil {
		return err
	}
	if p.Workers < 0 || p.Workers > maxWorkers {
		return ferr(f+".workers", "%d, want 1 to %d (0: the scenario's)", p.Workers, maxWorkers)
	}
	for j, d := range p.Down {
		if d < 1 || d > s.Processes {
			return ferr(fmt.Sprintf("%s.down[%d]", f, j), "process %d, want 1 to %d", d, s.Processes)
		}
	}
	return s.balance(f+".balance", p.Balance)
}

// phaseClasses checks the classes phase p (at field f) names and their
// shares.
func (s *Scenario) phaseClasses(p *Phase, f string) error {
	known := func(name string) bool {
		return slices.ContainsFunc(s.Classes, func(c Class) bool { return c.Name == name })
	}
	for j, name := range p.Classes {
		if !known(name) {
			return ferr(fmt.Sprintf("%s.classes[%d]", f, j), "%q is not a class of the scenario", name)
		}
	}
	total := 0.0
	for name, v := range p.Shares {
		if !known(name) {
			return ferr(f+".shares."+name, "%q is not a class of the scenario", name)
		}
		if !(v >= 0) || v > 1e6 {
			return ferr(f+".shares."+name, "%v, want a share in [0, 1e6]", v)
		}
		total += v
	}
	if len(p.Shares) > 0 && total == 0 {
		return ferr(f+".shares", "all shares are 0")
	}
	return nil
}

// ModeledCapacity returns the capacity the mix gives the worker pool, in
// units/s: workers divided by the mean worker time per unit.
func (s Scenario) ModeledCapacity() float64 {
	perUnit := 0.0 // worker-seconds per unit of offered load
	for _, c := range s.Classes {
		perUnit += c.Share / float64(c.Units) * c.Service.mean()
	}
	if perUnit == 0 {
		return 0
	}
	return float64(s.Workers) / perUnit
}
