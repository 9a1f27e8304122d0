package policy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"net/netip"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// Error is one problem in a policy file, at a line, in a field. When the
// problem was found by another package (an algorithm's parameters, the
// Redis store), Err holds that package's error: errors.Is and errors.As
// see it.
type Error = yamlfile.Error

// Errors is every problem found in a file, in file order. errors.Is and
// errors.As look into each one.
type Errors = yamlfile.Errors

// File is a parsed policy file. Every part keeps the line it came from, so
// errors found after parsing still point at the file.
type File struct {
	// Path is where the file was read from (for messages).
	Path string
	// Version is the schema version; only 1 exists.
	Version int
	// Service names the protected service (metrics, Redis keys).
	Service string
	// spec holds the free-text parts of the admission policy spec.
	spec specText
	// Store is where gate state lives.
	Store Store
	// identity says how requests are identified.
	identity identity
	// routes assign server-side class and cost.
	routes []route
	// ClassOrder is the order of classes as written (classes:), most
	// protected first; nil: the standard order (OrderOfClasses).
	ClassOrder []string
	// ClassOrderLine is the line of classes:.
	ClassOrderLine int
	// Gates is the chain, in evaluation order.
	Gates []Gate
}

// specText is the prose of the admission policy spec that the file cannot
// derive: what is protected, what a useful completion is, what is scarce.
type specText struct {
	Operation string // protected operation and useful-completion definition
	Resource  string // scarce resource, capacity evidence, safe region
	Owner     string // policy review owner
}

// Store backends.
const (
	BackendMemory = "memory"
	BackendRedis  = "redis"
)

// Store selects the state backend.
type Store struct {
	Backend    string             // BackendMemory (default) or BackendRedis
	Addrs      []string           // redis: addresses of a server or of cluster nodes
	Timeout    time.Duration      // redis: per-call timeout (0: the store's default)
	OnFailure  gate.FailurePolicy // default failure policy of the gates
	MaxKeys    int                // memory: key cap per gate (0: the store's default)
	Replicas   int64              // redis: expected fleet size; local_fallback gives each replica limit ÷ replicas
	ProbeEvery time.Duration      // redis: breaker probe interval (0: the store's default)
	Username   string             // redis: the ACL user (empty: the default user)
	// redis: where the password comes from (at most one; neither: none).
	// The password itself, read when the file is parsed, is kept unexported
	// and never printed.
	PasswordEnv, PasswordFile string
	tls                       *storeTLS // redis: TLS settings (nil: plain TCP)
	Line                      int
	password                  string
	passwordField             string // where the password was named, for a refusal's error
	passwordLine              int
	usernameLine              int // 0: no username (the default user)
	// onFailureSet records whether the file wrote on_failure.
	onFailureSet bool
}

// Inputs returns a digest of what the file read besides itself (the
// password file, the TLS files; "" when nothing): a reload of an unchanged
// file that finds them changed (a rotated secret) is a new policy. The
// digest is keyed with a key of this process (HMAC-SHA-256), so that it
// tells a change and nothing of a secret, wherever it ends up.
func (f *File) Inputs() string {
	s := f.Store
	if s.PasswordFile == "" && s.tls == nil {
		return ""
	}
	sum := hmac.New(sha256.New, inputsKey[:])
	if s.PasswordFile != "" {
		sum.Write([]byte(s.password))
	}
	if s.tls != nil {
		sum.Write([]byte(s.tls.digest))
	}
	return hex.EncodeToString(sum.Sum(nil)[:8])
}

// inputsKey keys Inputs' digest: random, and this process's alone.
var inputsKey = func() (k [32]byte) {
	rand.Read(k[:])
	return k
}()

// ReadsFiles reports whether the file reads other files (Inputs).
func (f *File) ReadsFiles() bool { return f.Store.PasswordFile != "" || f.Store.tls != nil }

// storeTLS is how the Redis store's connections are secured. The files
// are read when the policy file is parsed (so a reload takes rotated
// ones); config is what they make.
type storeTLS struct {
	CAFile     string // PEM CAs that sign the server's certificate (empty: the system's roots)
	CertFile   string // the client's certificate, for a server that asks for one (with KeyFile)
	KeyFile    string
	ServerName string // the name the server's certificate must hold (empty: each address's host)
	Line       int
	config     *tls.Config
	digest     string // of the settings and the files' contents: equal digests, same connection
}

// identity says where tenant, deadline and request id come from.
type identity struct {
	// The tenant key's parts, combined in this order: header, query,
	// claim, ip, route (identify.KeyRules). None: one anonymous tenant.
	TenantHeader   string
	TenantQuery    string
	TenantClaim    string
	TenantIP       bool
	TenantRoute    bool
	TenantRequired bool
	// ClientIP says how the ip part, and gates of scope client, find the
	// client's address.
	ClientIP identify.ClientIP
	// ClientIPLine is the line of client_ip (0: not written).
	ClientIPLine int
	// TrustedPeers are the sluice instances whose class header lowers a
	// request's class (identify.Peers).
	TrustedPeers []netip.Prefix
	// TokenHeader holds the bearer token of the claim part ("":
	// identify.DefaultTokenHeader).
	TokenHeader     string
	DeadlineHeader  string
	DefaultDeadline time.Duration
	MaxDeadline     time.Duration
	RequestIDHeader string
	// PathMatch is how request paths meet route paths.
	PathMatch identify.PathMatch
	// Line is the line of the identity section (0: not written).
	Line int
}

// tenantParts returns the parts of the tenant key, in the order they are
// combined.
func (id *identity) tenantParts() []identify.Part {
	var ps []identify.Part
	if id.TenantHeader != "" {
		ps = append(ps, identify.FromHeader(id.TenantHeader))
	}
	if id.TenantQuery != "" {
		ps = append(ps, identify.FromQuery(id.TenantQuery))
	}
	if id.TenantClaim != "" {
		ps = append(ps, identify.FromClaim(id.TenantClaim))
	}
	if id.TenantIP {
		ps = append(ps, identify.FromClientIP())
	}
	if id.TenantRoute {
		ps = append(ps, identify.FromRoute())
	}
	return ps
}

// route is one server-side class and cost rule.
type route struct {
	Method, Path string
	Class        string
	Cost         routeCost
	Line         int
}

// routeCost is a fixed cost or a cost from a bounded header.
type routeCost struct {
	Fixed    int64
	Header   string
	Per      int64
	Min, Max int64
	// ResponseHeader names the upstream's answer's header with the
	// work's actual cost (identify.Cost.ResponseHeader).
	ResponseHeader string
}

// least is the smallest cost a request of the route is charged at
// admission: a fixed cost, a header cost's minimum or, without the header,
// the fixed cost (1 unless written), or (a cost known from the answer
// only) the estimate, its minimum.
func (rc routeCost) least() int64 {
	if rc.Header != "" {
		return min(max(rc.Min, 1), max(rc.Fixed, 1))
	}
	k := max(rc.Fixed, 1)
	if rc.ResponseHeader != "" {
		k = max(k, rc.Min)
	}
	return k
}

// Gate is one gate of the chain, as written. The settings common to every
// kind are parsed into their typed values here; the kind's own settings
// live with its kind (see the package documentation).
type Gate struct {
	// Name is the gate's unique name.
	Name string
	// Kind names the gate's kind, e.g. "token_bucket".
	Kind string
	// Scope is what the gate counts over (the kind's default when the
	// file names none).
	Scope sluice.Scope
	// Mode is the gate's initial mode.
	Mode sluice.Mode
	// OnFailure is what the gate does when its store fails (the store's
	// default when the file names none; fail_open on the memory store).
	OnFailure gate.FailurePolicy
	// RetryHint is the retry-after of rejections without an exact wait
	// (0: the gate's default).
	RetryHint time.Duration
	// Classes limits the gate to requests of these classes; empty: all.
	Classes []string
	// Line is the line of the gate in its file.
	Line int

	kind   *kind
	params params
	lines  map[string]int // line of each field written, by key
}

// fieldLine returns the line of the gate's field key in its file, or the
// gate's own line when the field is not written.
func (g *Gate) fieldLine(key string) int {
	if l, ok := g.lines[key]; ok && l > 0 {
		return l
	}
	return g.Line
}

// written reports whether the file wrote the gate's field key.
func (g *Gate) written(key string) bool {
	_, ok := g.lines[key]
	return ok
}

// classes returns the classes the routes name, in first-seen order, with
// the default class last if some request can fall through to it.
func (f *File) classes() []string {
	var cs []string
	seen := map[string]bool{}
	for _, r := range f.routes {
		c := r.Class
		if c == "" {
			c = sluice.ClassDefault
		}
		if !seen[c] {
			seen[c] = true
			cs = append(cs, c)
		}
	}
	if !seen[sluice.ClassDefault] {
		cs = append(cs, sluice.ClassDefault)
	}
	return cs
}
