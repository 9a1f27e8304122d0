package whatif

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/queue"
)

// Options configures a replay.
type Options struct {
	// Candidate is the policy to try. Required.
	Candidate *policy.File
	// Current is the policy in force, replayed on the same traffic as the
	// baseline. Nil: the baseline is what the recording says (sluice's
	// log), or no admission control at all (nginx's and Envoy's).
	Current *policy.File
	// Interval is the timeline's step. Default one minute.
	Interval time.Duration
	// Seed picks the probabilistic gates' draws (default 1): a replay
	// repeats exactly.
	Seed uint64
	// Tenants is how many of the tenants refused most each run lists.
	// Default 10.
	Tenants int
	// RecordedCost charges each request the cost the log records (sluice's
	// log has it) instead of the cost the policy's routes give: for routes
	// whose cost is read from a request header, which logs do not carry.
	RecordedCost bool
	// Workers is the modeled upstream's size (upstream.go): admitted
	// requests are served by this many workers, one request each at a time,
	// the rest waiting in line first come first served, so latency grows
	// with what is admitted. Each is served for its recorded duration less
	// the wait for a worker the recording implies. 0: the fewest workers
	// that could have served the recording (no model if no request waited
	// for one); negative: no model (each admitted request takes its
	// recorded duration).
	Workers int
	// Deadline is the time each request gave itself, as its deadline header
	// would have said (logs do not carry it): read through the policy's
	// identity, so cut to its identity.deadline.max, and not replayed when
	// the policy reads no deadline header (a note says so). 0: the
	// policy's default.
	Deadline time.Duration
	// Follow makes the gates whose decisions depend on timing (every kind
	// but the rate kinds: concurrency, adaptive, deadline, utilization,
	// ...) decide as the recording says (follow.go), and turns the upstream
	// model off: the rate gates' replay can then be checked request for
	// request against the recording. It needs a log that names the gates
	// (sluice's).
	Follow bool
}

// Report is what a replay found.
type Report struct {
	// Requests replayed, from the first arrival to the last.
	Requests int64
	From, To time.Time
	Interval time.Duration
	// Candidate is the candidate policy's run; Baseline the current
	// policy's, or the recording's.
	Candidate, Baseline Run
	// Agreement compares the two request by request.
	Agreement Agreement
	// Notes say what could not be replayed faithfully.
	Notes []string
}

// Run is one policy's decisions on the traffic.
type Run struct {
	// Name is the policy file's path, "recorded" or "none".
	Name               string
	Admitted, Rejected int64
	// Gates are the refusals by gate and reason, most first.
	Gates []GateCount
	// Classes are the decisions by class (the candidate's routes).
	Classes []ClassCount
	// Tenants are the tenants refused most, most first.
	Tenants []TenantCount
	// Timeline has one point per Interval from From.
	Timeline []Point

	gate     []int32          // per request: the refusing gate's index in names, or -1
	refusals map[string]int64 // by tenant
}

// GateCount is one gate's refusals.
type GateCount struct {
	Gate, Reason string
	Rejected     int64
}

// ClassCount is one class's decisions.
type ClassCount struct {
	Class              string
	Admitted, Rejected int64
}

// TenantCount is one tenant's decisions.
type TenantCount struct {
	Tenant             string
	Admitted, Rejected int64
}

// Point is one step of a timeline.
type Point struct {
	T                  float64 // seconds since From
	Admitted, Rejected int64
}

// Agreement compares two runs request by request.
type Agreement struct {
	// Same is how many requests got the same decision; Share is Same over
	// the requests.
	Same  int64
	Share float64
	// Gates compares, gate by gate, the requests each run refused there.
	Gates []GateAgreement
}

// GateAgreement is one gate's refusals for one reason in both runs: by
// both, by the baseline only, by the candidate only. Share is Both over the
// larger of the two runs' refusals; Counts is the smaller of the two runs'
// refusals over the larger (both 1 when neither refused).
//
// Counts can be near 1 where Share is not: a rate gate at its limit turns
// away about as many requests in both runs, but once a later gate (an
// adaptive one, whose refusals depend on timing) refused a different
// request and the bucket got that request's tokens back, it turns away
// different ones.
type GateAgreement struct {
	Gate, Reason                      string
	Both, BaselineOnly, CandidateOnly int64
	Share, Counts                     float64
}

// Replay runs recs (sorted by arrival, as Read returns them) through the
// candidate and the baseline and compares them.
func Replay(recs []Record, opts Options) (*Report, error) {
	if opts.Candidate == nil {
		return nil, errors.New("whatif: no candidate policy")
	}
	if len(recs) == 0 {
		return nil, errors.New("whatif: no request to replay")
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Minute
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	if opts.Tenants <= 0 {
		opts.Tenants = 10
	}
	if span := time.Duration(recs[len(recs)-1].At - recs[0].At); span/opts.Interval > maxPoints {
		// A log spanning years (or a bogus timestamp) would make the
		// timeline huge: widen its step instead.
		opts.Interval = (span/maxPoints + time.Second).Truncate(time.Second)
	}
	rep := &Report{Requests: int64(len(recs)), From: time.Unix(0, recs[0].At), To: time.Unix(0, recs[len(recs)-1].At), Interval: opts.Interval}
	names := &gateNames{index: map[string]int32{}}
	if !sortedByArrival(recs) {
		return nil, errors.New("whatif: the records are not in arrival order")
	}
	if opts.Follow {
		opts.Workers = -1
	}
	var up fit
	given := opts.Workers > 0
	if opts.Workers >= 0 {
		up = fitUpstream(recs, opts.Workers)
		opts.Workers = up.workers
	}
	durs := estimates(recs, up.service)
	switch {
	case opts.Workers < 0:
	case up.workers == 0:
		rep.Notes = append(rep.Notes, "no admitted request has a duration: each takes the median, with no upstream model")
	case !given && up.queued == 0 && up.late == 0:
		// Nothing waited: the recording shows a lower bound of its
		// upstream's size, not its size, and a model that size would make
		// a candidate that admits more wait where the real one may not.
		opts.Workers, durs.service = -1, nil
		rep.Notes = append(rep.Notes, fmt.Sprintf("no request waited for the recording's upstream (at most %d were in flight): its capacity is unknown and no upstream is modeled (--workers sets one)", up.most))
	default:
		rep.Notes = append(rep.Notes, fmt.Sprintf("the upstream is modeled as %s in first-come first-served order, each request served for its recorded duration less its wait for a worker (%d of %d waited)%s", plural(up.workers, "worker"), up.queued, up.served, lateNote(up, given)))
	}
	cand, notes, err := replay(recs, opts.Candidate, opts, names, durs)
	if err != nil {
		return nil, fmt.Errorf("candidate %s: %w", opts.Candidate.Path, err)
	}
	rep.Candidate, rep.Notes = *cand, append(rep.Notes, notes...)
	if opts.Current != nil {
		cur, _, err := replay(recs, opts.Current, opts, names, durs)
		if err != nil {
			return nil, fmt.Errorf("current %s: %w", opts.Current.Path, err)
		}
		rep.Baseline = *cur
	} else {
		rep.Baseline = recorded(recs, opts, names)
	}
	rep.Agreement = agree(&rep.Candidate, &rep.Baseline, names)
	if durs.unknown > 0 {
		what := "recorded durations"
		if durs.service != nil {
			what = "service times"
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d requests have no recorded duration: they hold what they are admitted to for the median of their operation's %s (%v overall)", durs.unknown, what, durs.all))
	}
	return rep, nil
}

// lateNote says how many requests the pool could not have served ("" when
// none), and why: a number of workers given that is too small, or the
// log's clocks.
func lateNote(up fit, given bool) string {
	switch {
	case up.late == 0:
		return ""
	case given:
		return fmt.Sprintf("; %s left the recording's upstream before %s could have started them, and take no time: it had more", plural(up.late, "request"), plural(up.workers, "worker"))
	}
	return fmt.Sprintf("; %s left before they could have started, and take no time (the log's clocks reorder a few)", plural(up.late, "request"))
}

// plural is n and what, with an s unless n is 1.
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// maxPoints bounds a timeline's points.
const maxPoints = 10_000

// gateNames numbers gate names (with their reason) across runs.
type gateNames struct {
	index map[string]int32
	names []GateCount // Gate, Reason
}

func (g *gateNames) of(gate, reason string) int32 {
	k := gate + "\x00" + reason
	if i, ok := g.index[k]; ok {
		return i
	}
	i := int32(len(g.names))
	g.index[k] = i
	g.names = append(g.names, GateCount{Gate: gate, Reason: reason})
	return i
}

// durations holds how long a request holds what it is admitted to.
type durations struct {
	// service is, with an upstream model, each record's service time (-1:
	// none); nil without a model, where a request holds for its recorded
	// duration.
	service []time.Duration
	byOp    map[string]time.Duration // operation → the median of its known ones
	all     time.Duration            // the median of every known one
	unknown int64                    // requests with no recorded duration
}

// of is how long request i of recs holds what it is admitted to (with a
// model: a worker), the median of its operation's when it has none.
func (d *durations) of(recs []Record, i int32) time.Duration {
	if d.service != nil {
		if s := d.service[i]; s >= 0 {
			return s
		}
	} else if recs[i].Duration >= 0 {
		return recs[i].Duration
	}
	if v, ok := d.byOp[operation(&recs[i])]; ok {
		return v
	}
	return d.all
}

// estimates computes the medians durations.of falls back on: of the
// service times (nil: the recorded durations).
func estimates(recs []Record, service []time.Duration) *durations {
	byOp := map[string][]time.Duration{}
	var all []time.Duration
	d := &durations{service: service, byOp: map[string]time.Duration{}}
	for i := range recs {
		r := &recs[i]
		if r.Duration < 0 {
			d.unknown++
		}
		v := r.Duration
		if service != nil {
			v = service[i]
		}
		if v < 0 {
			continue
		}
		k := operation(r)
		byOp[k] = append(byOp[k], v)
		all = append(all, v)
	}
	median := func(v []time.Duration) time.Duration {
		slices.Sort(v)
		return v[len(v)/2]
	}
	for k, v := range byOp {
		d.byOp[k] = median(v)
	}
	if len(all) > 0 {
		d.all = median(all)
	}
	return d
}

// operation is the request's method and path with each segment that looks
// like an identifier (digits, or hex digits and dashes with a digit among
// them: 57336, 9f86d081, a UUID, a date) as "*": GET /v1/routes/57336 and
// GET /v1/routes/41 are one operation.
func operation(r *Record) string {
	if !strings.ContainsAny(r.Path, "0123456789") {
		return r.Method + " " + r.Path
	}
	segs := strings.Split(r.Path, "/")
	for i, s := range segs {
		if looksLikeID(s) {
			segs[i] = "*"
		}
	}
	return r.Method + " " + strings.Join(segs, "/")
}

func looksLikeID(s string) bool {
	digit := false
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'f', c >= 'A' && c <= 'F', c == '-':
		default:
			return false
		}
	}
	return digit
}

// vclock is the replay's virtual clock.
type vclock struct{ now int64 }

func (c *vclock) Now() clock.Instant { return clock.Instant(c.now) }

// event kinds
const (
	evDone     uint8 = iota // an admitted request's work ends
	evReady                 // a parked request got its slot or was turned away
	evExpire                // a parked request's wait runs out
	evStart                 // a paced request's work begins
	evTurnAway              // a followed gate turns the request away after its recorded wait (Options.Follow)
)

type event struct {
	t    int64
	kind uint8
	i    int32
}

type events []event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].i < h[j].i
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// flight is a request holding what it was admitted to.
type flight struct {
	tk     sluice.Ticket
	q      *queue.Queue // parked in q (nil: not parked)
	id     uint64
	ready  sluice.Decision
	status int
	late   int64 // the request's deadline on the virtual clock (0: none)
}

// runner replays one policy.
type runner struct {
	recs []Record
	opts Options
	// deadline is Options.Deadline as the deadline header's value ("" when
	// none is given, or the policy reads no such header).
	deadline string
	names    *gateNames
	durs     *durations
	clk      vclock
	t0       int64
	chain    *sluice.Chain
	id       *identify.Identifier
	rules    identify.Rules
	oneHdr   bool // the tenant is one header's value
	ctx      context.Context
	wait     time.Duration
	cur      int32 // the request being decided
	// prefixes are, with Options.Follow, the chains that end at each
	// followed gate that enforces (runner.following); turnAway is set
	// while a request the recording says such a gate turned away after a
	// wait is decided through its chain, to be turned away when the wait
	// ends.
	prefixes map[string]*sluice.Chain
	turnAway bool
	park     queue.Park
	ev       events
	flights  map[int32]*flight
	run      *Run
	class    []string // per request: its class
	hdr      http.Header
	up       *pool // nil: no upstream model
}

// replay runs recs through f.
func replay(recs []Record, f *policy.File, opts Options, names *gateNames, durs *durations) (*Run, []string, error) {
	if f.Store.Backend != policy.BackendMemory {
		cp := *f
		cp.Store.Backend = policy.BackendMemory
		f = &cp
	}
	r := &runner{recs: recs, opts: opts, names: names, durs: durs, t0: recs[0].At - int64(time.Second), flights: map[int32]*flight{},
		run: &Run{Name: f.Path, gate: make([]int32, len(recs))}, class: make([]string, len(recs)), hdr: http.Header{}}
	if opts.Workers > 0 {
		r.up = &pool{workers: opts.Workers}
	}
	rg := rand.New(rand.NewPCG(opts.Seed, 0x77686174))
	rt, err := policy.Build(f, nil, policy.Options{Clock: &r.clk, Virtual: true, Rand: rg.Float64})
	if err != nil {
		return nil, nil, err
	}
	defer rt.Close()
	r.chain, r.rules = rt.Chain, rt.Rules
	if r.id, err = identify.New(rt.Rules); err != nil {
		return nil, nil, err
	}
	var notes []string
	if opts.Follow {
		var names []string
		if r.chain, names, r.prefixes, err = r.following(rt.Chain, f); err != nil {
			return nil, nil, err
		}
		if len(names) > 0 {
			notes = append(notes, "these gates decided as the recording says (--follow): "+strings.Join(names, ", "))
		}
	}
	r.oneHdr = r.rules.TenantHeader != ""
	if d := opts.Deadline; d > 0 {
		// As the header would say it: the policy's identity reads it,
		// cuts it to its max, and without a deadline header ignores it.
		switch {
		case r.rules.DeadlineHeader == "":
			notes = append(notes, "--deadline "+d.String()+" is not replayed: the policy reads no deadline header (identity.deadline.header), so no request carries one")
		case d > r.id.Rules().MaxDeadline:
			notes = append(notes, "--deadline "+d.String()+" is cut to the policy's identity.deadline.max, "+r.id.Rules().MaxDeadline.String()+", as the header would be")
			fallthrough
		default:
			r.deadline = d.String()
		}
	}
	r.ctx = queue.ContextWithPark(sluice.ContextWithWait(context.Background(), &r.wait), &r.park)
	r.park.Ready = func(tag uint64, d sluice.Decision) {
		if fl := r.flights[int32(tag)]; fl != nil {
			fl.ready = d
			heap.Push(&r.ev, event{t: r.clk.now, kind: evReady, i: int32(tag)})
		}
	}
	for i := range recs {
		at := recs[i].At - r.t0
		r.until(at)
		r.clk.now = max(r.clk.now, at)
		r.decide(int32(i))
	}
	r.until(1<<63 - 1)
	r.finish()
	if !r.oneHdr && len(r.rules.Tenant.Parts) > 0 {
		notes = append(notes, "the candidate keys tenants by "+partsText(r.rules.Tenant.Parts)+": each request keeps the tenant the log names")
	}
	return r.run, notes, nil
}

// until processes the events due by t.
func (r *runner) until(t int64) {
	for len(r.ev) > 0 && r.ev[0].t <= t {
		e := heap.Pop(&r.ev).(event)
		r.clk.now = max(r.clk.now, e.t)
		fl := r.flights[e.i]
		if fl == nil {
			continue
		}
		switch e.kind {
		case evDone:
			o := sluice.OutcomeUseful
			switch {
			case fl.status >= 500:
				o = sluice.OutcomeErrored
			case fl.late > 0 && r.clk.now > fl.late:
				o = sluice.OutcomeLate
			}
			fl.tk.Done(o)
			delete(r.flights, e.i)
			if r.up != nil {
				if j := r.up.next(); j >= 0 {
					r.serve(j)
				}
			}
		case evStart:
			r.begin(e.i)
		case evTurnAway:
			rec := &r.recs[e.i]
			r.refuse(e.i, rec.Gate, rec.Reason)
			fl.tk.Done(sluice.OutcomeRejected)
			delete(r.flights, e.i)
		case evReady:
			if fl.q == nil {
				continue
			}
			fl.q = nil
			if fl.ready.Admitted {
				r.start(e.i, r.clk.now)
			} else {
				r.refuse(e.i, fl.ready.Gate, fl.ready.Reason.String())
				fl.tk.Done(sluice.OutcomeRejected)
				delete(r.flights, e.i)
			}
		case evExpire:
			if fl.q != nil && fl.q.Expire(fl.id) {
				r.refuse(e.i, fl.q.Name(), sluice.ReasonQueue.String())
				fl.q = nil
				fl.tk.Done(sluice.OutcomeRejected)
				delete(r.flights, e.i)
			}
		}
	}
}

// decide asks the chain about request i at the clock's time.
func (r *runner) decide(i int32) {
	rec := &r.recs[i]
	req, budget, ok := r.request(i, rec)
	if !ok {
		r.refuse(i, "", sluice.ReasonInvalid.String())
		return
	}
	r.wait, r.cur, r.turnAway = 0, i, false
	r.park.Tag, r.park.Queue = uint64(i), nil
	chain := r.chain
	if pc := r.prefixes[rec.Gate]; pc != nil && rec.Decision == Rejected && rec.Wait > 0 {
		chain, r.turnAway = pc, true
	}
	d, tk := chain.Decide(r.ctx, &req)
	if !d.Admitted {
		r.refuse(i, d.Gate, d.Reason.String())
		return
	}
	fl := &flight{tk: tk, status: rec.Status}
	if budget > 0 {
		fl.late = r.clk.now + int64(budget)
	}
	r.flights[i] = fl
	if r.park.Queue != nil {
		fl.q, fl.id = r.park.Queue, r.park.ID
		heap.Push(&r.ev, event{t: max(int64(r.park.Until), r.clk.now), kind: evExpire, i: i})
		return
	}
	if r.opts.Follow {
		// A followed gate decided as the recording says, after the wait
		// the recording says (rate gates before it give their tokens back
		// then, as they did).
		if r.turnAway {
			heap.Push(&r.ev, event{t: r.clk.now + int64(rec.Wait), kind: evTurnAway, i: i})
			return
		}
		r.wait = max(r.wait, rec.Wait) // the recorded wait holds any pacing
	}
	r.start(i, r.clk.now+int64(r.wait))
}

// request is record i as the candidate's routes and identity see it, with
// its time budget; ok false when the identity refuses it (invalid).
func (r *runner) request(i int32, rec *Record) (req sluice.Request, budget time.Duration, ok bool) {
	clear(r.hdr)
	if r.oneHdr && rec.Tenant != "" {
		r.hdr.Set(r.rules.TenantHeader, rec.Tenant)
	}
	if r.deadline != "" {
		r.hdr.Set(r.rules.DeadlineHeader, r.deadline)
	}
	remote := rec.Remote
	if _, _, err := net.SplitHostPort(remote); err != nil && remote != "" {
		remote = net.JoinHostPort(remote, "0")
	}
	budget, detail := r.id.IdentifyInput(&identify.Input{Method: rec.Method, Path: rec.Path, Header: r.hdr, RemoteAddr: remote}, &req)
	r.class[i] = req.Class
	if detail != "" {
		return req, 0, false
	}
	if !r.oneHdr && rec.Tenant != "" && len(r.rules.Tenant.Parts) > 0 {
		req.Tenant = rec.Tenant
	}
	if r.opts.RecordedCost && rec.Cost > 0 {
		req.Cost = min(rec.Cost, sluice.MaxCost)
	}
	if budget > 0 {
		req.Deadline = r.clk.Now().Add(budget)
	}
	return req, budget, true
}

// start counts request i admitted; its work begins at t.
func (r *runner) start(i int32, t int64) {
	r.run.gate[i] = -1
	if t > r.clk.now {
		heap.Push(&r.ev, event{t: t, kind: evStart, i: i})
		return
	}
	r.begin(i)
}

// begin sends request i upstream now: to a worker, or into the line.
func (r *runner) begin(i int32) {
	if r.up == nil || r.up.take(i) {
		r.serve(i)
	}
}

// serve schedules the end of request i's work, begun now.
func (r *runner) serve(i int32) {
	d := r.durs.of(r.recs, i)
	heap.Push(&r.ev, event{t: r.clk.now + int64(d), kind: evDone, i: i})
}

// refuse counts request i refused by gate for reason.
func (r *runner) refuse(i int32, gate, reason string) {
	r.run.gate[i] = r.names.of(gate, reason)
}

// finish sums the run's decisions.
func (r *runner) finish() {
	summarize(r.run, r.recs, r.opts, r.names, func(i int) string { return r.class[i] })
}

// recorded is the run the recording describes.
func recorded(recs []Record, opts Options, names *gateNames) Run {
	run := Run{Name: "recorded", gate: make([]int32, len(recs))}
	decided := false
	for i := range recs {
		run.gate[i] = -1
		if recs[i].Decision == Rejected {
			run.gate[i] = names.of(recs[i].Gate, recs[i].Reason)
		}
		decided = decided || recs[i].Decision != Unknown
	}
	if !decided {
		run.Name = "none"
	}
	summarize(&run, recs, opts, names, func(int) string { return "" })
	return run
}

// summarize fills a run's counts from its per-request decisions.
func summarize(run *Run, recs []Record, opts Options, names *gateNames, class func(int) string) {
	gates := map[int32]int64{}
	classes := map[string]*ClassCount{}
	tenants := map[string]*TenantCount{}
	t0 := recs[0].At
	step := int64(opts.Interval)
	run.Timeline = make([]Point, (recs[len(recs)-1].At-t0)/step+1)
	for i := range run.Timeline {
		run.Timeline[i].T = float64(int64(i)*step) / 1e9
	}
	for i := range recs {
		g := run.gate[i]
		p := &run.Timeline[(recs[i].At-t0)/step]
		c := classes[class(i)]
		if c == nil {
			c = &ClassCount{Class: class(i)}
			classes[c.Class] = c
		}
		tn := tenants[recs[i].Tenant]
		if tn == nil {
			tn = &TenantCount{Tenant: recs[i].Tenant}
			tenants[tn.Tenant] = tn
		}
		if g < 0 {
			run.Admitted++
			p.Admitted++
			c.Admitted++
			tn.Admitted++
			continue
		}
		run.Rejected++
		p.Rejected++
		c.Rejected++
		tn.Rejected++
		gates[g]++
	}
	for g, n := range gates {
		gc := names.names[g]
		gc.Rejected = n
		run.Gates = append(run.Gates, gc)
	}
	sort.Slice(run.Gates, func(i, j int) bool {
		if run.Gates[i].Rejected != run.Gates[j].Rejected {
			return run.Gates[i].Rejected > run.Gates[j].Rejected
		}
		return run.Gates[i].Gate < run.Gates[j].Gate
	})
	for _, c := range classes {
		if c.Class != "" {
			run.Classes = append(run.Classes, *c)
		}
	}
	sort.Slice(run.Classes, func(i, j int) bool { return run.Classes[i].Class < run.Classes[j].Class })
	run.refusals = map[string]int64{}
	for _, tn := range tenants {
		if tn.Rejected > 0 {
			run.Tenants = append(run.Tenants, *tn)
			run.refusals[tn.Tenant] = tn.Rejected
		}
	}
	sort.Slice(run.Tenants, func(i, j int) bool {
		if run.Tenants[i].Rejected != run.Tenants[j].Rejected {
			return run.Tenants[i].Rejected > run.Tenants[j].Rejected
		}
		return run.Tenants[i].Tenant < run.Tenants[j].Tenant
	})
	if len(run.Tenants) > opts.Tenants {
		run.Tenants = run.Tenants[:opts.Tenants]
	}
}

// agree compares the candidate's decisions with the baseline's, gate and
// reason by gate and reason.
func agree(cand, base *Run, names *gateNames) Agreement {
	var a Agreement
	type counts struct{ both, baseOnly, candOnly int64 }
	byGate := map[int32]*counts{}
	at := func(g int32) *counts {
		c := byGate[g]
		if c == nil {
			c = &counts{}
			byGate[g] = c
		}
		return c
	}
	for i := range cand.gate {
		cg, bg := cand.gate[i], base.gate[i]
		if (cg < 0) == (bg < 0) {
			a.Same++
		}
		switch {
		case cg >= 0 && cg == bg:
			at(cg).both++
		default:
			if bg >= 0 {
				at(bg).baseOnly++
			}
			if cg >= 0 {
				at(cg).candOnly++
			}
		}
	}
	a.Share = float64(a.Same) / float64(max(len(cand.gate), 1))
	for g, c := range byGate {
		n := names.names[g]
		ga := GateAgreement{Gate: n.Gate, Reason: n.Reason, Both: c.both, BaselineOnly: c.baseOnly, CandidateOnly: c.candOnly, Share: 1, Counts: 1}
		if m := max(c.both+c.baseOnly, c.both+c.candOnly); m > 0 {
			ga.Share = float64(c.both) / float64(m)
			ga.Counts = float64(min(c.both+c.baseOnly, c.both+c.candOnly)) / float64(m)
		}
		a.Gates = append(a.Gates, ga)
	}
	sort.Slice(a.Gates, func(i, j int) bool {
		if a.Gates[i].Gate != a.Gates[j].Gate {
			return a.Gates[i].Gate < a.Gates[j].Gate
		}
		return a.Gates[i].Reason < a.Gates[j].Reason
	})
	return a
}

// partsText names a tenant key's parts.
func partsText(parts []identify.Part) string {
	s := ""
	for i, p := range parts {
		if i > 0 {
			s += "+"
		}
		s += p.Source.String()
		if p.Name != "" {
			s += " " + strconv.Quote(p.Name)
		}
	}
	return s
}
