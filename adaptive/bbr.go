package adaptive

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// BBRConfig configures a BBR controller. Zero fields take the defaults.
type BBRConfig struct {
	// Initial, Min and Max bound the limit. Defaults 1, 1, 10,000: the
	// controller finds the service's size itself, from one request in
	// flight up.
	Initial, Min, Max int
	// Headroom is how far above the estimated capacity N̂ the limit sits:
	// limit = ⌊(1 + Headroom)·N̂⌋. It keeps the service busy across the gap
	// between a completion and the next admission, and bounds the queue
	// the service holds to about Headroom of its service time. Default
	// 0.1.
	Headroom float64
	// Tolerance is how much slower than the no-load RTT a window may be
	// and still show no queue at the service. Default 0.1.
	Tolerance float64
	// ProbeInterval is how often, while the service holds a queue, the
	// limit drops for one window to ProbeShare of N̂ so that the queue
	// drains and the no-load RTT is measured afresh. Probes fall on
	// multiples of ProbeInterval since Epoch, so the processes of a fleet
	// in front of one service drain it together. Default 10 s.
	ProbeInterval time.Duration
	// ProbeShare is the share of N̂ the limit drops to while it probes, in
	// (0, 1). Default 0.75.
	ProbeShare float64
	// RateSpan is how long the highest completion rate of a window that
	// used the whole limit stands as the service's bottleneck rate.
	// Default 10 s.
	RateSpan time.Duration
	// LateShare is the share of a window's completions past their
	// deadline above which, while the service queues, the controller
	// drops the headroom (the limit goes to N̂) and measures the service
	// afresh. Default 0.02.
	LateShare float64
	// Epoch is the wall-clock time of the zero Instant of the clock the
	// windows are read on, which places the probes in wall-clock time.
	// Default: that of clock.System. A simulation sets its own.
	Epoch time.Time
}

// bbr is the state of the BBR controller (NewBBR).
type bbr struct {
	cfg    BBRConfig
	offset int64 // Epoch in Unix ns
	est    float64
	limit  int // what Limit returns: est, or the probe's limit

	startup   bool
	fullRate  float64 // startup: the rate the last growth step reached
	fullCount int     // startup: limited windows since the rate last grew by a quarter
	startWork float64 // startup: the work done of the last window that used the limit

	base   map[string]time.Duration // no-load RTT by kind of work (Sample.Key)
	seen   map[string]int           // samples of each kind, up to firmBaseline
	first  map[string]keyStats      // the samples of each kind not yet firm
	rtt0   time.Duration            // the last window's no-load RTT, for its mix
	rates  [rateRing]rateSample
	nrates int
	ri     int

	probing      bool          // the window in progress runs at the probe limit
	afterProbe   bool          // the window in progress is the one after a probe
	stale        bool          // the rates predate a change: reset them after the probe
	lateAfter    clock.Instant // late windows ask for no probe before this
	probeNow     bool          // probe in the next window, whatever the slot
	verify       bool          // probe again at half the limit in the next window
	verifying    bool          // the probe in progress is such a second one
	probeLimit   int           // the limit of the last probe
	lastRTT      time.Duration // the last window's mean RTT
	queuedInSlot bool          // a window of the current slot showed a queue
	usedInSlot   bool          // a window of the current slot used the whole limit
	probedSlot   int64         // the probe slot of the last probe (or of the first window)
	slot         int64         // the probe slot of the last window
	slotSeen     bool

	grewFrom int           // the limit before the last growth step (0: the last step was not one)
	keep     int           // a limit a step up reached and paid off at (0: none): the limit stays at it
	grewRate float64       // the rate at grewFrom
	ceiling  int           // a limit that showed a queue without a gain in rate (0: none)
	backoff  time.Duration // how long ceiling stands after it last failed
	upAfter  clock.Instant // until when growth stays below ceiling

	freeWork float64       // the most work a window without a queue got done lately
	freeAt   clock.Instant // when
	regrow   bool          // a stall was seen: start up again once the probes are done
	regrowTo float64       // the limit that startup grows back to (+Inf: as far as it goes; 0: none)
}

const rateRing = 32

// staleProbes is how many whole ProbeIntervals (probe slots) a no-load
// RTT stands unmeasured while the limit is used whole (scheduleProbe).
const staleProbes = 6

type rateSample struct {
	at   clock.Instant
	rate float64 // no-load work done per second, in slots (N̂ of one window)
}

const (
	bbrBackoffMin = 10 * time.Second
	// bbrBackoffLate is the least a limit whose queue made answers late
	// stands as the ceiling: a failed step up costs those answers, not
	// only a short queue.
	bbrBackoffLate = time.Minute
	bbrBackoffMax  = time.Minute
)

var (
	_ Controller   = (*bbr)(nil)
	_ shortWindows = (*bbr)(nil)
)

// NewBBR returns the BBR controller, at cfg.Initial; an invalid
// configuration is an error that wraps ErrInvalidConfig.
//
// BBR sizes a concurrency limit as BBR sizes a TCP window (Cardwell et
// al., "BBR: Congestion-Based Congestion Control", ACM Queue 14(5), 2016):
// from two estimates that a standing queue cannot absorb, the work the
// service gets done and its no-load RTT. By Little's law their product is
// N̂, the concurrency at which the service is busy without a queue: for N
// workers, N. The limit is (1 + Headroom)·N̂, so the service holds a queue
// of about Headroom of its service time, and its rate and latency stay
// where they are however long the overload lasts. (Gradient2's long-term
// average, by contrast, takes a standing queue in as the new normal and
// lets the limit climb until every answer is late.)
//
// Both estimates are kept per kind of work (Sample.Key: the request's
// operation or class), since a mix that moves toward cheap requests would
// otherwise read as a faster service: each kind has its own no-load RTT, a
// window's N̂ is the sum of its samples' no-load RTTs over its length (the
// slots of no-load work it got done per second), and its queue is the
// ratio of its RTTs to their no-load RTTs. N̂ is the highest of the windows
// of the last RateSpan that used the whole limit. A kind's no-load RTT is
// the mean of its first 30 samples, then the lowest window mean (plus its
// standard error) since the last probe, and a probe's own reading.
//
// It starts at Initial and doubles the limit every few round trips while
// windows use it whole without a queue showing (BBR's startup), until the
// RTT rises by a quarter or the work done stops growing (if the last
// doubling, from L, got no more work done, L + 1 counts as a failed step
// up; a doubling whose window got a quarter less done than the one before
// met a stall, not a queue, and the startup steps back and doubles again
// once it ends). After that a
// window that used the whole limit with no queue at the service (the
// limit, not the service, was the bottleneck) grows it by Headroom; a limit
// that then showed a queue with no gain in work is not tried again for a
// while that doubles each time it fails (10 s up to 1 min; 1 min when its
// queue made answers late), so that a service of one or two workers runs
// at its size rather than at one more, and one that got its workers back
// is used again within about a minute.
// Every ProbeInterval in which a limit the controller then kept filled a
// queue at the service (not the startup's last doubling or a step up it
// took back: those queues drain by themselves), on wall-clock slots (a
// fleet's proxies drain one service together), the limit drops for a few
// round trips to ProbeShare·N̂ and the RTTs of the
// requests admitted then are the no-load RTTs again. A probe that reads
// half again as slow is verified at half the limit (slower, or a queue the
// probe did not drain: the service got smaller), and the work done is
// measured afresh after it; so is one that reads a quarter faster (the
// no-load RTTs were too long, learned during a stall, and the probe's
// limit, sized from them, may not have drained the queue they let in); a
// window whose RTT more than doubled probes at once; and a no-load RTT no
// probe has measured for 6 ProbeIntervals while the limit is used whole
// is measured too (one learned during a slowdown hides the queue its
// limit lets in, and no queue would ever ask). A window with more
// than LateShare of late completions while the service queues drops the
// headroom (the callers' deadlines leave no room for the queue) and
// probes; unless the window got less than half the work
// done of a recent one without a queue, or its RTT rose more than its
// limit's queue could raise it: that is a stall (of the service, or of the
// host the proxy shares), which lowers the limit while it lasts but sets
// no ceiling, and after the probes the startup grows the limit back to
// where it was. A queue the limit did not fill, or a window that did not
// use the limit, changes nothing.
//
// Guarantee (TestBBRHoldsAnHour): in front of a FIFO service of N workers
// (1 to 32) and service time S (5 to 200 ms, constant or exponential)
// offered 3× its capacity for an hour, every minute after the first keeps
// goodput at 90% of capacity or more, the limit's median within [N, 1.25·N
// + 1], its maximum within 2·N + 1, and the service's queue within N + 1.
// Over whole incidents of a mixed service (capacity halved and back, a
// slower dependency, a retry storm, a ramp, a flash crowd, a partial
// fleet) see sluice sim --incidents.
func NewBBR(cfg BBRConfig) (Controller, error) { return controller(newBBR(cfg)) }

// newBBR is NewBBR with the concrete type (for the package's tests).
func newBBR(cfg BBRConfig) (*bbr, error) {
	if err := bounds(&cfg.Initial, &cfg.Min, &cfg.Max, 1, 1, 10000); err != nil {
		return nil, err
	}
	if cfg.Headroom == 0 {
		cfg.Headroom = 0.1
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = 0.1
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 10 * time.Second
	}
	if cfg.ProbeShare == 0 {
		cfg.ProbeShare = 0.75
	}
	if cfg.RateSpan == 0 {
		cfg.RateSpan = 10 * time.Second
	}
	if cfg.LateShare == 0 {
		cfg.LateShare = 0.02
	}
	if cfg.Epoch.IsZero() {
		cfg.Epoch = clock.SystemEpoch()
	}
	switch {
	case !(cfg.Headroom > 0 && cfg.Headroom <= 1):
		return nil, paramErr("headroom", "bbr: headroom %v, want (0, 1]", cfg.Headroom)
	case !(cfg.Tolerance > 0 && cfg.Tolerance < 1):
		return nil, paramErr("tolerance", "bbr: tolerance %v, want (0, 1)", cfg.Tolerance)
	case cfg.ProbeInterval < time.Second:
		return nil, paramErr("probe_interval", "bbr: probe interval %v, want ≥ 1s", cfg.ProbeInterval)
	case !(cfg.ProbeShare > 0 && cfg.ProbeShare < 1):
		return nil, paramErr("probe_share", "bbr: probe share %v, want (0, 1)", cfg.ProbeShare)
	case cfg.RateSpan < 0:
		return nil, paramErr("rate_span", "bbr: negative rate span")
	case !(cfg.LateShare > 0 && cfg.LateShare < 1):
		return nil, paramErr("late_share", "bbr: late share %v, want (0, 1)", cfg.LateShare)
	}
	b := &bbr{cfg: cfg, offset: cfg.Epoch.UnixNano(), est: float64(cfg.Initial), limit: cfg.Initial, startup: true, backoff: bbrBackoffMin}
	return b, nil
}

// Update applies one window.
func (b *bbr) Update(w Window) int {
	if w.Samples == 0 || w.RTT <= 0 {
		return b.limit
	}
	st := b.observe(w)
	nhat := b.maxRate(w.End)
	switch {
	case nhat <= 0:
		// No rate yet (a window without its span): nothing to size from.
	case st.late && st.m.queued && !st.probe:
		b.onLate(w, st, nhat)
	case b.startup:
		b.startupStep(w.End, st, nhat)
	case st.m.queued && st.limited:
		// At most a fifth down a window: a no-load RTT read low by chance
		// makes every window look queued, and the limit would follow the
		// rate its own cut lowered (late windows act at once, above). Not
		// below a step up that paid off.
		b.est = max((1+b.cfg.Headroom)*nhat, 0.8*b.est, float64(b.keep))
	case st.m.queued:
		// A queue the limit did not fill: the service's own slowness, or
		// other callers'. Not this limit's to shrink.
	case st.probe:
		// A probe measures; the windows after it size the limit.
	case st.limited && !st.drained:
		b.stepUp(w, st, nhat)
	}
	b.est = clamp(b.est, b.cfg.Min, b.cfg.Max)
	b.limit = int(b.est)
	if st.m.queued && st.limited && b.limit >= st.applied {
		// A queue this limit filled and stays at: its no-load RTT wants
		// measuring. Not one the limit has just left (the startup's last
		// doubling, a step up that gained nothing, late answers): that
		// queue drains by itself, and a probe would only cost work (at a
		// limit of 2, half of it for a window).
		b.queuedInSlot = true
	}
	if st.limited {
		b.usedInSlot = true
	}
	b.scheduleProbe(w, nhat)
	b.growBack()
	return b.limit
}

// growBack starts the startup again once the probes after a stall are
// done, when the stall left the limit below where it was.
func (b *bbr) growBack() {
	if !b.regrow || b.probing || b.verify || b.probeNow {
		return
	}
	b.regrow = false
	if b.regrowTo > b.est {
		b.startup, b.fullRate, b.fullCount, b.startWork = true, 0, 0, 0
	} else {
		b.regrowTo = 0
	}
}

// windowState is what Update knows of a window once it is measured.
type windowState struct {
	m              measured
	applied        int  // the limit the window ran at
	limited        bool // it used the whole limit
	probe, drained bool // it was a probe; the one after a probe
	late           bool // more than LateShare of it was late behind a queue
	grew           int  // the limit before the step up that led to it (0: none)
}

// observe measures w, records its work done, and settles what the probes
// and the last step up asked to learn from it.
func (b *bbr) observe(w Window) windowState {
	st := windowState{applied: b.limit, probe: b.probing, drained: b.afterProbe}
	st.limited = w.InFlight >= st.applied
	b.afterProbe = st.probe
	b.probing = false
	verify := st.probe && b.verifying
	b.verifying = false
	st.m = b.measure(w, st.probe, verify)
	b.lastRTT = w.RTT
	if m := st.m; !m.queued && m.work > 0 && (m.work >= b.freeWork || w.End.Sub(b.freeAt) > b.cfg.RateSpan) {
		b.freeWork, b.freeAt = m.work, w.End
	}
	if rate := st.m.work; !st.probe && rate > 0 && (st.limited || rate > b.maxRate(w.End)) {
		b.addRate(w.End, rate)
	}
	if st.m.slower || st.m.faster {
		// Slower: the service got slower, or the probe did not drain its
		// queue (it got smaller). Faster: the no-load RTTs of before were
		// too long (learned while the service or the host stalled, or the
		// service got faster), and the probe, whose limit N̂ sized from
		// them, may not have drained the queue they let in. Either way a
		// second probe at half the limit tells which, and the work done
		// measured against the no-load RTTs of before no longer holds:
		// the next window that uses the limit measures it afresh. (A
		// second probe is never itself slower or faster.)
		b.stale, b.verify = true, true
	}
	if st.probe && b.stale {
		b.stale, b.keep = false, 0
		b.resetRates(w.End, 0) // the rates start again
	}
	st.late = float64(st.m.queuedLate) > b.cfg.LateShare*float64(w.Samples)
	st.grew, b.grewFrom = b.grewFrom, 0
	b.settleStepUp(w, st)
	if st.m.queued && st.limited && !st.probe && st.m.ratio > 2+st.m.sig && w.End >= b.lateAfter {
		// The RTT more than doubled against the no-load RTTs: the service
		// got slower (its no-load RTTs are stale, and the work it does
		// would read as a fraction of its size) or smaller. Measure.
		b.probeNow = true
		b.lateAfter = w.End.Add(b.cfg.ProbeInterval)
	}
	return st
}

// settleStepUp judges the step up that led to window w, if one did and
// it met a queue: a failure when it got no more work done, kept when it
// did.
func (b *bbr) settleStepUp(w Window, st windowState) {
	if !st.m.queued || st.grew == 0 || st.applied <= st.grew {
		return
	}
	if st.m.work <= b.grewRate*(1+b.cfg.Tolerance) {
		b.failed(w.End, st.applied) // the step up met a queue and no more work done
		return
	}
	// The step up met a queue but got more work done: the extra requests
	// keep the service busy across the gap between a completion and the
	// next admission (which N̂, counting that gap as no-load time, sizes at
	// less than one request for a service of one or two workers). The
	// limit keeps it.
	b.keep = st.applied
}

// onLate answers a window whose requests miss their deadlines behind a
// queue at the service (unless the window shows a stall, see stalled):
// the headroom is more than the callers' deadlines leave room for, and
// the limit drops to N̂, where the service holds no queue; a step back up
// waits, as after a failed one. The service may also have got slower or
// smaller, which the rate and the no-load RTT of before would hide for
// their spans: the next window measures the no-load RTT, and the rate
// starts again after it (at most once a ProbeInterval).
func (b *bbr) onLate(w Window, st windowState, nhat float64) {
	startup := b.startup
	b.startup = false
	if w.End >= b.lateAfter {
		b.stale, b.probeNow = true, true
		b.lateAfter = w.End.Add(b.cfg.ProbeInterval)
	}
	// N̂ reads a little below the service's workers (the gap between a
	// completion and the next admission counts as idle): rounded, 3.9
	// holds 4 workers busy, where ⌊3.9⌋ left one idle for as long as the
	// step back up waits.
	held := max(1, math.Round(nhat))
	if b.stalled(w, st) {
		// Not this limit's queue: the service, or the host between the
		// proxy and it, stalled or got slower. Fewer requests in flight
		// while it lasts, but no ceiling: once the probe has measured the
		// service afresh, the limit grows back as the startup grew it, a
		// few round trips a doubling, to where it was (or, when the stall
		// cut the first startup short, as far as the startup goes).
		switch {
		case !startup:
			b.regrowTo = max(b.regrowTo, b.est)
		case b.regrowTo == 0:
			b.regrowTo = math.Inf(1) // the first startup, cut short
		}
		b.est, b.keep, b.regrow = min(b.est, held), 0, true
		return
	}
	b.regrow, b.regrowTo = false, 0 // a queue this limit filled, after all
	if float64(st.applied) > nhat {
		// Every limit above the one held queued at the service, and the
		// callers' deadlines leave no room for a queue: the ceiling is the
		// next one up, not only the limit that showed it. (From a startup
		// that ended at 8 in front of 4 workers, the step up to 5 came
		// seconds later and made 14 answers late; the startup's own
		// ceiling, where its last doubling gained nothing, can be lower.)
		ceiling := min(st.applied, int(held)+1)
		if c := b.startupCeiling(st); startup && c > 0 {
			ceiling = min(ceiling, c)
		}
		b.failed(w.End, ceiling)
		b.backoff = max(b.backoff, bbrBackoffLate)
		b.upAfter = w.End.Add(b.backoff)
	}
	b.est, b.keep = min(b.est, held), 0
}

// stalled reports whether late window w shows a stall rather than a queue
// this limit filled: a queue raises the RTT while the service keeps its
// rate, a stall (the service paused, the host that runs the proxy or the
// service lent its CPUs elsewhere) raises the RTT and drops the rate.
// Either the RTT rose more than a queue of the window's limit could raise
// it at a service of even one worker (the service got less done than one
// worker does: a stall from the first windows, when N̂ was measured during
// it), or the window got less than half the work done that a window
// without a queue got done within RateSpan. (On a host whose two cores
// were taken, one such stall held the limit of 32 workers of 5 ms at 1
// for the minute a late ceiling stands.)
func (b *bbr) stalled(w Window, st windowState) bool {
	if st.m.ratio > float64(st.applied)*(1+b.cfg.Tolerance)+st.m.sig {
		return true
	}
	return b.freeWork > 0 && w.End.Sub(b.freeAt) <= b.cfg.RateSpan && st.m.work < b.freeWork/2
}

// stepUp answers a window that used every slot with no queue at the
// service: the limit, not the service, may be the bottleneck. (Not so in
// the window after a probe, whose no queue is the one the probe drained.)
// It grows by Headroom, up to below a limit that failed lately.
func (b *bbr) stepUp(w Window, st windowState, nhat float64) {
	if st.grew > 0 && st.applied > st.grew {
		b.backoff = bbrBackoffMin // the last step up found room
		if st.applied >= b.ceiling {
			b.ceiling = 0
		}
	}
	up := b.est + max(1, b.cfg.Headroom*b.est)
	if b.ceiling > 0 && w.End < b.upAfter {
		up = min(up, float64(b.ceiling)-0.5)
	}
	b.est = max(b.est, (1+b.cfg.Headroom)*nhat, up)
	if int(b.est) > st.applied {
		b.grewFrom, b.grewRate = st.applied, st.m.work
	}
}

// startupStep doubles the limit while windows use it whole without a
// queue, and ends the startup once a queue shows or the rate stops
// growing.
func (b *bbr) startupStep(now clock.Instant, st windowState, nhat float64) {
	m := st.m
	if !st.limited {
		return
	}
	queued := m.ratio > 1.25+m.sig
	if queued && m.work < 0.75*b.startWork {
		// The doubling got less work done than the limit before it, which
		// no queue does: the service, or the host the proxy shares,
		// stalled. (On a host whose two cores were taken, such a window
		// ended the startup of 8 workers of 5 ms at 2, and the ceiling it
		// set kept them there for 10 s.) Back to the limit before it, still
		// starting up: the doubling is tried again once the stall ends.
		b.est = max(1, float64(st.applied)/2)
		return
	}
	x := nhat
	if x >= 1.25*b.fullRate {
		b.fullRate, b.fullCount = x, 0
	} else {
		b.fullCount++
	}
	if queued || b.fullCount >= 3 {
		// The last doubling met a queue, or no more rate: the limit of
		// before it was below the service's size. (N̂ alone would size it
		// from a rate the demand, not the service, set.)
		b.startup, b.regrowTo = false, 0
		b.est = max(b.est/2, (1+b.cfg.Headroom)*nhat)
		// Only a doubling that met a queue at the service and got no more
		// work done says the service is full below it. One that got no
		// more work without a queue met another bottleneck (the callers'
		// pace, the host's CPU): 8 workers of 5 ms behind a proxy that
		// shares two cores with its load ended their startup at 2 that
		// way, and a ceiling of 3 kept them there for the step.
		if c := b.startupCeiling(st); c > 0 && queued {
			b.failed(now, c)
		}
		return
	}
	b.startWork = m.work
	b.est = max(2*b.est, (1+b.cfg.Headroom)*nhat)
	if b.regrowTo > 0 && b.est >= b.regrowTo {
		// Back where a stall found it: from here on as before it.
		b.est, b.startup, b.regrowTo = b.regrowTo, false, 0
	}
}

// startupCeiling is the limit the startup's last doubling showed to gain
// nothing: if the window at twice L got no more work done than the one at
// L (within Tolerance), the service has L workers or fewer, and L + 1
// would fail as a step up; 0 if it did gain. (A service of two workers
// was tried at three right after its startup had tried four, and a
// deadline of twice its service time made that trial's answers late.)
func (b *bbr) startupCeiling(st windowState) int {
	half := st.applied / 2
	if half < 1 || b.startWork <= 0 || st.m.work > (1+b.cfg.Tolerance)*b.startWork {
		return 0
	}
	return half + 1
}

// failed records that limit showed a queue without a gain in rate right
// after a step up: it is not tried again for the backoff, which doubles
// each time the same limit fails.
func (b *bbr) failed(now clock.Instant, limit int) {
	if b.ceiling == limit {
		b.backoff = min(2*b.backoff, bbrBackoffMax)
	} else {
		b.backoff = bbrBackoffMin
	}
	b.ceiling = limit
	b.upAfter = now.Add(b.backoff)
}

// scheduleProbe makes the next window a probe when asked to (probeNow),
// or when a new probe slot begins and the service queued in the slot
// before: a standing queue would otherwise pass for the no-load RTT, and a
// no-load RTT that noise pulled low would stay.
func (b *bbr) scheduleProbe(w Window, nhat float64) {
	slot := floorDiv(int64(w.End)+b.offset, int64(b.cfg.ProbeInterval))
	newSlot := b.slotSeen && slot != b.slot
	if !b.slotSeen {
		b.probedSlot = slot // a new controller's no-load RTT is fresh
	}
	b.slot, b.slotSeen = slot, true
	if b.verify {
		// The second probe, right after the first, at half its limit.
		b.verify, b.verifying, b.probing = false, true, true
		b.limit = max(b.cfg.Min, b.probeLimit/2)
		b.probeLimit = b.limit
		return
	}
	now := b.probeNow
	b.probeNow = false
	if !now && !newSlot {
		return
	}
	queued, used := b.queuedInSlot, b.usedInSlot
	if newSlot {
		b.queuedInSlot, b.usedInSlot = false, false
	}
	// A no-load RTT no probe has measured for staleProbes slots, while the
	// limit is used whole, is measured too: one learned while the service
	// was slower hides the queue its limit lets in (RTT over no-load RTT
	// reads 1), so that no queue ever asks for a probe, and the limit
	// stayed at 2.5 times the service's size for good after a hundredfold
	// slowdown ended.
	// Counted in slots, not time: a fleet's proxies probe in the same
	// slots, whatever their windows' phases.
	stale := used && slot-b.probedSlot > staleProbes
	if b.startup || nhat <= 0 || !(now || queued || stale) {
		return
	}
	b.probing, b.probedSlot = true, slot
	b.grewFrom = 0
	b.limit = min(b.limit, max(b.cfg.Min, int(b.cfg.ProbeShare*b.est/(1+b.cfg.Headroom))))
	b.probeLimit = b.limit
}

// NextWindow returns the length of the next window when it is short: in
// the startup, four RTTs; in a probe, which needs only to drain the
// service's queue and see enough requests through at the probe's limit
// for a mean, four RTTs or as long as 50 requests take at the probe's
// limit. Otherwise 0: a window of the Windower's length, which also
// bounds these; either way a window has at least the Windower's
// MinSamples.
func (b *bbr) NextWindow(rtt time.Duration) time.Duration {
	if b.lastRTT == 0 {
		b.lastRTT = rtt // the first window's
	}
	if b.startup && b.lastRTT > 0 {
		// The startup doubles the limit a few round trips apart, as
		// BBR's doubles its window each round trip: a service found
		// from one request in flight within a second, not in seconds.
		return 4 * b.lastRTT
	}
	if !b.probing {
		return 0
	}
	return time.Duration(max(4, 50/float64(max(b.probeLimit, 1))) * float64(b.lastRTT))
}

// maxRate returns the highest rate recorded within RateSpan before now,
// or the latest one when none is that recent.
func (b *bbr) maxRate(now clock.Instant) float64 {
	if b.nrates == 0 {
		return 0
	}
	var best float64
	found := false
	for i := range b.nrates {
		s := b.rates[i]
		if now.Sub(s.at) <= b.cfg.RateSpan {
			best, found = max(best, s.rate), true
		}
	}
	if !found {
		return b.rates[(b.ri+rateRing-1)%rateRing].rate
	}
	return best
}

func (b *bbr) addRate(at clock.Instant, rate float64) {
	b.rates[b.ri] = rateSample{at, rate}
	b.ri = (b.ri + 1) % rateRing
	b.nrates = min(b.nrates+1, rateRing)
}

func (b *bbr) resetRates(at clock.Instant, rate float64) {
	b.nrates, b.ri = 0, 0
	if rate > 0 {
		b.addRate(at, rate)
	}
}

// Limit returns the current limit.
func (b *bbr) Limit() int { return b.limit }

// Estimate returns the limit before truncation (outside a probe).
func (b *bbr) Estimate() float64 { return b.est }

// NoLoadRTT returns the no-load RTT of the last window's mix of work (0
// before the first window).
func (b *bbr) NoLoadRTT() time.Duration { return b.rtt0 }

// Capacity returns N̂, the estimated concurrency at which the service is
// busy without a queue (0 before the first window with a rate).
func (b *bbr) Capacity(now clock.Instant) float64 {
	return b.maxRate(now)
}

// BBRState is what BBR reports of itself (the admin API's /v1/gates).
type bbrState struct {
	// Capacity is N̂, the concurrency at which the service is busy without
	// a queue; NoLoadMs the no-load RTT of the last window's mix of work.
	Capacity float64 `json:"capacity"`
	NoLoadMs float64 `json:"no_load_ms"`
	Startup  bool    `json:"startup,omitempty"`
	Probing  bool    `json:"probing,omitempty"`
	// Ceiling is a limit a step up failed at lately, which the limit
	// stays below for CeilingForS more seconds (absent: none).
	Ceiling     int     `json:"ceiling,omitempty"`
	CeilingForS float64 `json:"ceiling_for_s,omitempty"`
	// Keep is a limit a step up reached and paid off at: the limit stays
	// at it or above (absent: none).
	Keep int `json:"keep,omitempty"`
}

// State returns the controller's estimates at now. Not safe for concurrent
// use with Update (the gate serializes them).
func (b *bbr) State(now clock.Instant) any {
	st := bbrState{Capacity: math.Round(100*b.maxRate(now)) / 100, NoLoadMs: float64(b.rtt0.Microseconds()) / 1000,
		Startup: b.startup, Probing: b.probing, Keep: b.keep}
	if b.ceiling > 0 && now < b.upAfter {
		st.Ceiling, st.CeilingForS = b.ceiling, math.Round(b.upAfter.Sub(now).Seconds()*10)/10
	}
	return st
}

// Probing reports whether the window in progress is a probe.
func (b *bbr) Probing() bool { return b.probing }

// floorDiv is ⌊a/n⌋ for n > 0.
func floorDiv(a, n int64) int64 {
	q := a / n
	if a%n != 0 && (a < 0) != (n < 0) {
		q--
	}
	return q
}

// measured is what one window says of the service.
type measured struct {
	work   float64 // no-load work done per second, in slots: Σ RTT₀ of its samples ÷ its span
	ratio  float64 // Σ RTT ÷ Σ RTT₀ of its samples: 1 without a queue
	sig    float64 // twice the standard error of ratio
	queued bool    // ratio above 1 + Tolerance + sig
	slower bool    // a probe found the service slower than its no-load RTTs
	faster bool    // a probe found it faster by a quarter
	// queuedLate counts the late samples of kinds of work that queued:
	// work late at its no-load RTT (slower than its callers' deadlines
	// whatever the limit) says nothing of the limit.
	queuedLate int
}

// maxBaselines bounds the kinds of work whose no-load RTT is kept.
const maxBaselines = 4 * maxKeys

// firmBaseline is how many samples of a kind of work its no-load RTT is
// the mean of before windows may only lower it.
const firmBaseline = 30

// measure updates the no-load RTT of each kind of work the window holds
// and returns what the window says against them. A probe's RTTs (of the
// requests admitted at its limit) are each kind's no-load RTT now: halfway
// from the last estimate when close to it (so that one probe's noise moves
// it half as far), the probe's own when it differs by half or more. Any
// other window may only lower an estimate, with its mean plus its standard
// error (the least of noisy means would sit below the service's).
func (b *bbr) measure(w Window, probe, verify bool) measured {
	keys := keysOf(w)
	if b.base == nil {
		b.base, b.seen, b.first = map[string]time.Duration{}, map[string]int{}, map[string]keyStats{}
	}
	if len(b.base)+len(keys) > maxBaselines {
		b.forget(keys)
	}
	var m measured
	was, now, noise := b.learn(keys, probe, verify)
	// Slower by half, beyond chance: a probe of a few dozen requests of a
	// noisy service reads high now and then.
	m.slower = probe && !verify && was > 0 && now > (1.5+noise)*was
	m.faster = probe && !verify && now > 0 && was > (1.25+noise)*now
	var base, sum, variance float64
	for _, k := range keys {
		base += float64(k.Samples) * b.base[k.Key].Seconds()
		sum += k.Sum.Seconds()
		variance += float64(k.Samples) * k.Var()
	}
	if base <= 0 {
		return m
	}
	b.rtt0 = time.Duration(base / float64(w.Samples) * float64(time.Second))
	if w.End > w.Start {
		m.work = base / w.End.Sub(w.Start).Seconds()
	}
	m.ratio = sum / base
	m.sig = 2 * math.Sqrt(variance) / base
	m.queued = m.ratio > 1+b.cfg.Tolerance+m.sig
	for _, k := range keys {
		kb := float64(k.Samples) * b.base[k.Key].Seconds()
		if k.Late > 0 && kb > 0 && k.Sum.Seconds() > (1+b.cfg.Tolerance)*kb+2*math.Sqrt(float64(k.Samples)*k.Var()) {
			m.queuedLate += k.Late
		}
	}
	return m
}

// keysOf returns w's samples by kind of work; a window built by hand
// without them is one kind.
func keysOf(w Window) []keyStats {
	if w.keys != nil {
		return w.keys
	}
	n := float64(w.Samples)
	mean := w.RTT.Seconds()
	dev := w.RTTDev.Seconds()
	return []keyStats{{Samples: w.Samples, Sum: w.RTT * time.Duration(w.Samples),
		SumSq: n * (mean*mean + dev*dev*max(n-1, 0)/n), FreshSamples: w.FreshSamples,
		FreshSum: w.FreshRTT * time.Duration(w.FreshSamples), Late: w.Late}}
}

// learn updates the no-load RTTs of keys and returns, for a probe, the
// old and new no-load RTTs of the kinds it measured, weighed by samples,
// and twice the relative standard error of its RTTs.
func (b *bbr) learn(keys []keyStats, probe, verify bool) (was, now, noise float64) {
	crowded := b.crowded(keys)
	var sum, variance float64
	measured := make(map[string]bool, len(keys))
	for _, k := range keys {
		sum += k.Sum.Seconds()
		variance += float64(k.Samples) * k.Var()
		old := b.base[k.Key]
		switch {
		case probe && (k.FreshSamples >= 3 || k.Samples >= 3):
			r := b.learnProbe(k, old, verify)
			measured[k.Key] = true
			if old > 0 {
				was += float64(k.Samples) * float64(old)
				now += float64(k.Samples) * float64(r)
			}
		case b.seen[k.Key] < firmBaseline && (old == 0 || !crowded):
			b.learnFirst(k)
		case k.Samples >= 10:
			if r := k.Mean() + stdErr(k); r < old {
				b.base[k.Key] = r
			}
		}
		if b.seen[k.Key] >= firmBaseline {
			delete(b.first, k.Key)
		}
	}
	// The kinds a probe saw too few of move with those it measured, when
	// those moved by half or more: a service four times slower is four
	// times slower at its rare work too, which a few dozen requests of a
	// probe seldom show (a stale no-load RTT makes every window of that
	// kind look queued).
	if probe && was > 0 && (now > 1.5*was || 3*now < 2*was) {
		f := now / was
		for key, old := range b.base {
			if !measured[key] {
				b.base[key] = time.Duration(float64(old) * f)
			}
		}
	}
	if sum > 0 {
		noise = 2 * math.Sqrt(variance) / sum
	}
	return was, now, noise
}

// learnProbe sets the no-load RTT of k's kind of work from a probe's
// reading (of the requests admitted during it, when there are 3) and
// returns the reading; old is the no-load RTT before.
func (b *bbr) learnProbe(k keyStats, old time.Duration, verify bool) time.Duration {
	r := k.Mean()
	if k.FreshSamples >= 3 {
		r = k.FreshSum / time.Duration(k.FreshSamples)
	}
	switch {
	case verify && old > 0:
		b.base[k.Key] = min(old, r) // the lower load's reading
	case old == 0 || float64(r) > 1.5*float64(old) || 3*r < 2*old:
		b.base[k.Key] = r
	default:
		b.base[k.Key] = (r + old) / 2 // one probe's noise moves it half as far
	}
	return r
}

// learnFirst folds k into a kind of work seen fewer than firmBaseline
// times: the mean of all its samples so far stands for it (the least of a
// few small windows would sit far below it).
func (b *bbr) learnFirst(k keyStats) {
	a := b.first[k.Key]
	a.Samples += k.Samples
	a.Sum += k.Sum
	a.SumSq += k.SumSq
	b.first[k.Key] = a
	b.seen[k.Key] += k.Samples
	b.base[k.Key] = a.Mean() + stdErr(a)
}

// crowded reports whether the window's kinds of work already known show a
// queue: the samples of a window that does must not go into a no-load RTT
// still being learned.
func (b *bbr) crowded(keys []keyStats) bool {
	var known, sum, variance float64
	for _, k := range keys {
		if old := b.base[k.Key]; old > 0 {
			known += float64(k.Samples) * old.Seconds()
			sum += k.Sum.Seconds()
			variance += float64(k.Samples) * k.Var()
		}
	}
	return known > 0 && sum > (1.25+2*math.Sqrt(variance)/known)*known
}

// stdErr is the standard error of k's mean RTT.
func stdErr(k keyStats) time.Duration {
	if k.Samples == 0 {
		return 0
	}
	return time.Duration(math.Sqrt(k.Var()/float64(k.Samples)) * float64(time.Second))
}

// forget drops the no-load RTTs of kinds of work the window does not hold,
// to make room: kinds come and go, and their number is not bounded.
func (b *bbr) forget(keep []keyStats) {
	in := make(map[string]bool, len(keep))
	for _, k := range keep {
		in[k.Key] = true
	}
	for k := range b.base {
		if !in[k] {
			delete(b.base, k)
			delete(b.seen, k)
			delete(b.first, k)
		}
	}
}
