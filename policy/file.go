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
	KindSlidingWindow: true, KindSlidingLog: true, KindLeakyBucket: true}

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
	Line      int
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
)

// kindFields lists, per kind, the fields that apply and those required.
var kindFields = map[string]struct{ allowed, required []string }{
	KindTokenBucket:   {[]string{"rate", "burst", "refund"}, []string{"rate", "burst"}},
	KindGCRA:          {[]string{"rate", "burst", "refund"}, []string{"rate", "burst"}},
	KindFixedWindow:   {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindSlidingWindow: {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindSlidingLog:    {[]string{"limit", "window", "refund"}, []string{"limit", "window"}},
	KindLeakyBucket:   {[]string{"rate", "queue"}, []string{"rate", "queue"}},
	KindConcurrency:   {[]string{"limit", "ttl", "weighted"}, []string{"limit"}},
}

// commonGateFields apply to every kind.
var commonGateFields = []string{"name", "kind", "scope", "mode", "on_failure", "retry_hint", "classes"}
