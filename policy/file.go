package policy

import (
	"time"

	"github.com/sluice-go/sluice/limit"
)

// File is a parsed policy file. Every field keeps the line it came from, so
// errors found after parsing still point at the file.
type File struct {
	// Path is where the file was read from (for messages).
	Path string
	// Version is the schema version; only 1 exists.
	Version int
	// Service names the protected service.
	Service string
	// Spec holds the free-text parts of the admission policy spec.
	Spec Spec
	// Store is where gate state lives.
	Store Store
	// Identity says how requests are identified.
	Identity Identity
	// Routes assign server-side class and cost.
	Routes []Route
	// Gates is the chain, in evaluation order.
	Gates []Gate
}

// Spec is the prose of the admission policy spec that the file cannot
// derive: what is protected, what a useful completion is, what is scarce.
type Spec struct {
	Operation string // protected operation and useful-completion definition
	Resource  string // scarce resource, capacity evidence, safe region
	Owner     string // policy review owner
}

// Store selects the state backend.
type Store struct {
	Backend    string        // "memory" (default) or "redis"
	Addrs      []string      // redis addresses
	Cluster    bool          // redis cluster
	Timeout    time.Duration // per-call timeout
	OnFailure  string        // default failure policy of gates
	MaxKeys    int           // memory: key cap per gate
	Replicas   int64         // redis: expected fleet size; local_fallback gives each replica limit/replicas
	ProbeEvery time.Duration // redis: breaker probe interval
	Line       int
}

// redisKinds are the gate kinds with a Redis script (all of them).
var redisKinds = map[string]bool{KindTokenBucket: true, KindGCRA: true, KindFixedWindow: true, KindConcurrency: true,
	KindSlidingWindow: true, KindSlidingLog: true, KindLeakyBucket: true, KindFleetUsage: true,
	// Utilization and the ladder measure this process; they keep no shared state.
	KindUtilization: true, KindLadder: true}

// Identity says where tenant and deadline come from.
type Identity struct {
	TenantHeader    string
	TenantRequired  bool
	DeadlineHeader  string
	DefaultDeadline time.Duration
	MaxDeadline     time.Duration
	RequestIDHeader string
}

// Route is one server-side class and cost rule.
type Route struct {
	Method, Path string
	Class        string
	Cost         Cost
	Line         int
}

// Cost is a fixed cost or a cost from a bounded header.
type Cost struct {
	Fixed    int64
	Header   string
	Per      int64
	Min, Max int64
}

// Gate is one gate of the chain, as written.
type Gate struct {
	Name      string
	Kind      string
	Scope     string
	Mode      string
	OnFailure string
	Rate      limit.Rate
	RateText  string
	Burst     int64
	Limit     int64
	Window    time.Duration
	Queue     int64
	TTL       time.Duration
	RetryHint time.Duration
	NoRefund  bool
	Weighted  bool
	Classes   []string // applies only to these classes; empty: all

	// Protection gates (fleet_usage, utilization, ladder).
	Reserve                   map[string]float64 // fleet_usage: share per reserved class
	Good, Bad                 float64            // utilization thresholds
	Delay                     time.Duration      // utilization: pressure before the first shed
	ShedAllAfter              time.Duration      // utilization: full pressure to full shed
	Tiers                     []string           // utilization: classes, first shed first
	Workers                   int64              // utilization, ladder: capacity in concurrent requests
	SampleEvery               time.Duration      // utilization, ladder
	CostAware                 bool               // utilization
	Source                    string             // utilization: "workers" (own accounting) or "cpu"
	DegradeEnter, DegradeExit float64            // ladder
	ShedEnter, ShedExit       float64            // ladder
	MinDwell                  time.Duration      // ladder
	StepEvery                 time.Duration      // ladder
	RecoverSteps              []float64          // ladder
	Protected                 []string           // ladder: classes never shed

	Line int
	// fields holds the names of the fields written, for the per-kind check.
	fields map[string]int
}

// Gate kinds this version knows.
const (
	KindTokenBucket   = "token_bucket"
	KindGCRA          = "gcra"
	KindFixedWindow   = "fixed_window"
	KindSlidingWindow = "sliding_window"
	KindSlidingLog    = "sliding_log"
	KindLeakyBucket   = "leaky_bucket"
	KindConcurrency   = "concurrency"
	KindFleetUsage    = "fleet_usage"
	KindUtilization   = "utilization"
	KindLadder        = "ladder"
)

// FieldLine returns the line of the gate's field name in its file, or the
// gate's own line when the field is not written.
func (g *Gate) FieldLine(name string) int {
	if l, ok := g.fields[name]; ok && l > 0 {
		return l
	}
	return g.Line
}

// kindFields lists, per kind, the fields that apply and those required.
var kindFields = map[string]struct{ allowed, required []string }{
	KindTokenBucket:   {[]string{"rate", "burst", "refund"}, []string{"rate", "burst"}},
	KindGCRA:          {[]string{"rate", "burst", "refund"}, []string{"rate", "burst"}},
	KindFixedWindow:   {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindSlidingWindow: {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindSlidingLog:    {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindLeakyBucket:   {[]string{"rate", "queue"}, []string{"rate", "queue"}},
	KindConcurrency:   {[]string{"limit", "ttl", "weighted"}, []string{"limit"}},
	KindFleetUsage:    {[]string{"limit", "reserve", "ttl"}, []string{"limit", "reserve"}},
	KindUtilization: {[]string{"good", "bad", "delay", "shed_all_after", "tiers", "workers", "sample_every", "cost_aware", "source"},
		[]string{"tiers"}},
	KindLadder: {[]string{"degrade", "shed", "min_dwell", "recover", "step_every", "sample_every", "protected", "workers"},
		[]string{"workers"}},
}

// protectionKinds are per-process or fleet protection gates: they answer
// 503 and take no rate.
var protectionKinds = map[string]bool{KindFleetUsage: true, KindUtilization: true, KindLadder: true}

// commonGateFields apply to every kind.
var commonGateFields = []string{"name", "kind", "scope", "mode", "on_failure", "retry_hint", "classes"}
