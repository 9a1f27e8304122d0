package policy

import (
	"fmt"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// SpecText renders the filled-in admission policy spec, the review artifact
// of an admission policy: every part the file determines is filled from
// the file, each gate described by its kind, and the prose parts come from
// its spec section.
func (f *File) SpecText() string {
	w := &specWriter{f: f}
	w.header()
	w.workModel()
	w.hierarchy()
	w.stateMachine()
	w.contract()
	w.evidence()
	return w.b.String()
}

// specWriter writes the sections of a file's spec.
type specWriter struct {
	f *File
	b strings.Builder
}

func (w *specWriter) line(label, format string, args ...any) {
	fmt.Fprintf(&w.b, "  %s: %s\n", label, fmt.Sprintf(format, args...))
}

// prose is a free-text part of the spec, or how to add it.
func prose(s, field string) string {
	if s == "" {
		return "(not stated: add spec." + field + " to the policy file)"
	}
	return s
}

func (w *specWriter) service() string {
	if w.f.Service == "" {
		return "(unnamed service)"
	}
	return w.f.Service
}

func (w *specWriter) header() {
	f := w.f
	fmt.Fprintf(&w.b, "ADMISSION POLICY  %s  (%s)\n", w.service(), f.Path)
	w.line("Protected operation and useful-completion definition", "%s", prose(f.spec.Operation, "operation"))
	w.line("Scarce resource(s), capacity evidence, and safe operating region", "%s", prose(f.spec.Resource, "resource"))
	names := make([]string, len(f.Gates))
	for i, g := range f.Gates {
		names[i] = g.Name
	}
	w.line("Decision point and rejection cost budget", "sluice in front of %s, one chain evaluated in order: %s; a rejection is answered in process, before any upstream work, with a small fixed-size body",
		w.service(), strings.Join(names, " -> "))
}

func (w *specWriter) workModel() {
	f := w.f
	w.b.WriteString("\nWORK MODEL\n")
	w.line("Classes / tenants / authorized priority", "%s; classes from server-side routes only, never from the client: %s", tenantText(f.identity), strings.Join(w.classes(), "; "))
	w.line("Demand unit and pre-admission estimator", "%s", strings.Join(costsText(f.routes), "; "))
	var bursts []string
	for _, g := range f.Gates {
		if b, ok := g.params.(burster); ok {
			bursts = append(bursts, fmt.Sprintf("%s allows bursts of %d per %s", g.Name, b.bursts(), g.Scope))
		}
	}
	if len(bursts) == 0 {
		bursts = []string{"no burst allowance configured"}
	}
	w.line("Arrival, burst, skew, retry, and failure assumptions", "%s; retries arrive as new offered load and are decided like any request", strings.Join(bursts, "; "))
	dl := deadlineText(f.identity)
	if f.identity.DeadlineHeader == "" && f.identity.DefaultDeadline == 0 {
		for _, g := range f.Gates {
			if g.Kind == deadlineKind.name {
				dl += fmt.Sprintf("; gate %s tests deadlines only where the server gives requests one (a gRPC call's, through grpcgate): behind sluice proxy or serve no request has one and it admits all", g.Name)
			}
		}
	}
	w.line("Deadline and correctness invariants", "%s", dl)
}

func tenantText(id identity) string {
	parts := id.tenantParts()
	if len(parts) == 0 {
		return "one shared anonymous tenant (no identity.tenant)"
	}
	var what []string
	for _, p := range parts {
		switch p.Source {
		case identify.SourceHeader:
			what = append(what, "header "+p.Name)
		case identify.SourceQuery:
			what = append(what, "query parameter "+p.Name)
		case identify.SourceClaim:
			what = append(what, "claim "+p.Name+" of the bearer token in "+orDefault(id.TokenHeader, identify.DefaultTokenHeader)+" (not verified here: verified upstream)")
		case identify.SourceClientIP:
			what = append(what, clientIPText(id.ClientIP))
		case identify.SourceRoute:
			what = append(what, "the route")
		}
	}
	t := "tenant = " + strings.Join(what, " + ")
	if id.TenantRequired {
		t += " (required)"
	}
	return t
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// clientIPText describes where the client's address comes from.
func clientIPText(c identify.ClientIP) string {
	v4, v6 := c.IPv4Prefix, c.IPv6Prefix
	if v4 == 0 {
		v4 = identify.DefaultIPv4Prefix
	}
	if v6 == 0 {
		v6 = identify.DefaultIPv6Prefix
	}
	from := "the peer's address"
	if len(c.TrustedProxies) > 0 {
		ps := make([]string, len(c.TrustedProxies))
		for i, p := range c.TrustedProxies {
			ps[i] = p.String()
		}
		from = fmt.Sprintf("the peer's address, or from %s the right-most untrusted %s entry", strings.Join(ps, ", "), c.Header)
	}
	return fmt.Sprintf("client IP (%s; IPv4 per /%d, IPv6 per /%d)", from, v4, v6)
}

// classes describes each class by the routes that assign it.
func (w *specWriter) classes() []string {
	var out []string
	for _, c := range w.f.classes() {
		var where []string
		for _, r := range w.f.routes {
			if r.Class == c || (r.Class == "" && c == sluice.ClassDefault) {
				where = append(where, strings.TrimSpace(r.Method+" "+r.Path))
			}
		}
		if len(where) == 0 {
			where = []string{"requests no route matches"}
		}
		out = append(out, fmt.Sprintf("%s (%s)", c, strings.Join(where, ", ")))
	}
	return out
}

func costsText(routes []route) []string {
	costs := []string{"1 unit per request unless a route says otherwise"}
	for _, r := range routes {
		where := strings.TrimSpace(r.Method + " " + r.Path)
		switch {
		case r.Cost.Header != "":
			per, lo, hi := max(r.Cost.Per, 1), max(r.Cost.Min, 1), r.Cost.Max
			bound := fmt.Sprintf("[%d, %d]", lo, hi)
			if hi == 0 {
				bound = fmt.Sprintf("[%d, no max]", lo)
			}
			costs = append(costs, fmt.Sprintf("%s: ceil(%s / %d) clamped to %s", where, r.Cost.Header, per, bound))
		case r.Cost.Fixed > 1:
			costs = append(costs, fmt.Sprintf("%s: %d units", where, r.Cost.Fixed))
		}
	}
	return costs
}

func deadlineText(id identity) string {
	if id.DeadlineHeader == "" {
		return "no deadline header configured: every completion counts as useful"
	}
	maxBudget := id.MaxDeadline
	if maxBudget == 0 {
		maxBudget = identify.DefaultMaxDeadline
	}
	def := "none"
	if id.DefaultDeadline > 0 {
		def = id.DefaultDeadline.String()
	}
	return fmt.Sprintf("remaining budget from header %s (longer budgets clamped to %v; without the header: %s) bounds the work's context; a response after it counts as late, not useful",
		id.DeadlineHeader, maxBudget, def)
}

func (w *specWriter) hierarchy() {
	f := w.f
	w.b.WriteString("\nHIERARCHY\n")
	w.line("Global / region / worker budgets", "%s", storeText(f.Store))
	var res []string
	for i := range f.Gates {
		if r, ok := f.Gates[i].params.(reserver); ok {
			res = append(res, r.reservation(&f.Gates[i]))
		}
	}
	reservations := "none configured"
	if len(res) > 0 {
		reservations = strings.Join(res, "; ")
	}
	w.line("Reservations, weights, borrow rules, and revocation time", "%s", reservations)
	w.b.WriteString("  Rate, burst, concurrency, queue, and cost bounds:\n")
	for i := range f.Gates {
		g := &f.Gates[i]
		fmt.Fprintf(&w.b, "    - %s: %s [%s]\n", g.Name, g.params.describe(g), g.Mode)
	}
	bound := "in-process state: with N replicas each enforces its own limits, so a fleet admits up to N times each limit"
	if f.Store.Backend == BackendRedis {
		bound = "none while Redis answers (one atomic decision per request); during an outage fail_open admits without limit, local_fallback up to the fleet limit (replicas x limit/replicas), fail_closed nothing"
	}
	if leased := leasedGates(f); len(leased) > 0 {
		bound += "; leased gates (" + strings.Join(leased, ", ") + "): the grants never sum above the budget, so the fleet admits at most " +
			"rate x (T + burst) in any window T, or holds at most the limit in flight; a process whose demand fell holds its grant unused " +
			"until its next refresh (at most the budget for one refresh interval); after the allocator lost its state it confirms holdings " +
			"for one lease time, and the holdings not yet confirmed may be spent again by safe shares until their holders refresh (at most " +
			"2x for one refresh interval; none with on_failure: closed); with the allocator unreachable a lease runs to its expiry, then " +
			"its on_failure decides (safe: budget / clients last seen each; safe shares come on top of the others' grants, so with one " +
			"process cut off alone, or leases coming back at different moments after an outage, the fleet can spend up to 2x until the " +
			"last is back)"
	}
	w.line("Maximum distributed overshoot or unused lease", "%s", bound)
}

// leaser is a kind whose gates may spend a lease of a fleet budget
// (lease:): leased reports whether these settings do.
type leaser interface {
	leased() bool
}

// leasedGates names the gates that spend a lease.
func leasedGates(f *File) []string {
	var out []string
	for i := range f.Gates {
		if l, ok := f.Gates[i].params.(leaser); ok && l.leased() {
			out = append(out, f.Gates[i].Name)
		}
	}
	return out
}

func (w *specWriter) stateMachine() {
	w.b.WriteString("\nSTATE MACHINE\n")
	var states [][2]string
	for _, g := range w.f.Gates {
		if m, ok := g.params.(stateMachiner); ok {
			states = m.stateMachine()
		}
	}
	if states == nil {
		w.line("NORMAL / DEGRADE / SHED / RECOVER", "no degradation ladder configured: every gate acts the same in every state")
	}
	for _, st := range states {
		w.line(st[0], "%s", st[1])
	}
}

func (w *specWriter) contract() {
	f := w.f
	w.b.WriteString("\nFAILURE AND CLIENT CONTRACT\n")
	var failures, e429, e503 []string
	for _, g := range f.Gates {
		if g.kind.stored {
			failures = append(failures, fmt.Sprintf("%s %s", g.Name, g.OnFailure))
		}
		if g.entitlement() {
			e429 = append(e429, g.Name)
		} else {
			e503 = append(e503, g.Name)
		}
	}
	w.line("Limiter unavailable/stale/partitioned behavior", "%s; per gate: %s", storeFailure(f.Store), strings.Join(failures, ", "))
	w.line("429/503 or protocol-specific rejection semantics", "429 Too Many Requests (the caller's entitlement): %s; 503 Service Unavailable (capacity): %s; 400 for malformed identity, cost or deadline headers",
		listOrNone(e429), listOrNone(e503))
	j := sluice.DefaultJitter
	w.line("Effect possibility, retry eligibility, delay, jitter, and attempt budget", "every rejection happens before execution (effect_possible false); Retry-After is the exact wait rounded up to whole seconds plus jitter over [w, w + max(%d, ceil(w x %.1f))]; a cost above a burst is not retryable and gets no Retry-After; RateLimit-Policy and RateLimit fields (%s) on admitted and rate-limited responses, for the quotas counted per caller (tenant, tenant_operation, client) only", j.Min, j.Fraction, wire.Draft)
	w.line("Static fallback / disable / operator override", "each gate switches between enforce, shadow and off at run time (admin endpoint /v1/gates); the file reloads on SIGHUP or change, and an invalid file is refused while the old policy keeps serving")
}

func (w *specWriter) evidence() {
	w.b.WriteString("\nEVIDENCE\n")
	w.line("Offered, admitted, completed, late, rejected, and retried demand", "/metrics: sluice_requests_offered_total, _admitted_total, _rejected_total{reason,gate,mode}, _completed_total{outcome}; demand units per class and tenant by stage: sluice_demand_units_total{stage=offered|admitted|rejected|consumed}")
	w.line("Goodput and fairness by class/tenant", "sluice_goodput_units_total{class,tenant} and completions by outcome, per class and tenant (tenant label capped)")
	w.line("Overload, dependency slowdown, limiter loss, and recovery tests", "`sluice sim --config` runs this file's gates on a virtual clock against modeled overload (load sweeps, load and service-time steps, retry storms), and `sluice sim --incidents --config` through whole incidents (hour-long overloads, capacity steps, a slow dependency, a retry storm, a diurnal ramp, a flash crowd, a partial fleet) with a pass/fail bar; `sluice demo` sweeps real open-loop load from 0.5x to 10x capacity with and without admission")
	w.line("Abort, rollback, and policy review owner", "%s", prose(w.f.spec.Owner, "owner"))
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func storeText(s Store) string {
	if s.Backend != BackendRedis {
		keys := fmt.Sprintf("default cap %d keys (about %d MB, and each key's bytes past 28) per gate", memory.DefaultMaxKeys, memory.DefaultMaxKeys*128>>20)
		if s.MaxKeys > 0 {
			keys = fmt.Sprintf("cap %d keys per gate", s.MaxKeys)
		}
		return "per-process memory store (" + keys + "; at the cap fresh keys are dropped first, then new keys share one overflow budget)"
	}
	return fmt.Sprintf("Redis at %s shared by the fleet (one atomic script per decision on Redis time); local_fallback gives each of %d replicas limit/%d", strings.Join(s.Addrs, ", "), max(s.Replicas, 1), max(s.Replicas, 1))
}

func storeFailure(s Store) string {
	if s.Backend != BackendRedis {
		return "the memory store is part of the process and cannot be unreachable"
	}
	t := s.Timeout
	if t == 0 {
		t = sredis.DefaultTimeout
	}
	return fmt.Sprintf("each Redis call times out after %v; after a failure a breaker answers at once from the failure policy and probes Redis once per interval", t)
}

// Optional parts of a kind's settings that the spec reads.
type (
	// burster is a kind that allows bursts.
	burster interface{ bursts() int64 }
	// reserver is a kind that reserves capacity for classes.
	reserver interface{ reservation(g *Gate) string }
	// stateMachiner is a kind that moves the service through the
	// degradation states.
	stateMachiner interface{ stateMachine() [][2]string }
)

// scoped ends a rate or concurrency limit's description: its scope and
// the classes it applies to.
func scoped(g *Gate) string { return " per " + g.Scope.String() + classesOnly(g) }

// classesOnly names the classes a gate applies to, if it is limited.
func classesOnly(g *Gate) string {
	if len(g.Classes) == 0 {
		return ""
	}
	return ", for class " + strings.Join(g.Classes, ", ") + " only"
}
