package host

import (
	"embed"
	"io/fs"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/metrics"
)

// The live page: an HTML page with its script and style sheet, embedded
// (no CDN, no external fonts), that opens on the last five minutes of
// readings (GET /v1/live/history), then polls GET /v1/live and draws what it
// reads. Neither needs the admin token: they show what /metrics shows
// (tenant labels, never keys; no quotas). With the token the operator types
// in, the page switches gate modes (POST /v1/gates/{name}) and shows the
// tenants behind the labels (POST /v1/tenants/lookup).

//go:embed live
var liveFiles embed.FS

// liveCSP keeps the page to its own origin: nothing it loads or calls can
// leave the admin listener.
const liveCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// DefaultLiveTenants is the tenants /v1/live lists in each top by default.
const DefaultLiveTenants = 10

// live is the body of GET /v1/live.
type live struct {
	// Time is the wall time of the reading; the page plots rates between
	// readings.
	Time time.Time `json:"time"`
	// Policy is the digest of the policy serving.
	Policy  string                `json:"policy"`
	Classes []metrics.ClassCounts `json:"classes"`
	Tenants liveTenants           `json:"tenants"`
	Gates   []liveGate            `json:"gates"`
	// Totals sums the classes: offered, admitted, useful, rejected
	// (enforced), consumed_units, inflight.
	Totals map[string]int64 `json:"totals"`
}

type liveTenants struct {
	Rejected metrics.TenantTop `json:"rejected"`
	Consumed metrics.TenantTop `json:"consumed"`
}

// liveGate is a gate as the live page shows it: its mode and what it
// reports about itself (the capabilities /metrics exports), without its
// quota (which GET /v1/gates shows behind the token).
type liveGate struct {
	Name string `json:"name"`
	Mode string `json:"mode"`
	// Level is a ladder's level (normal, degrade, shed, recover).
	Level string `json:"level,omitempty"`
	// ShedFraction is the fraction of load a shedder sheds, in [0, 1].
	ShedFraction *float64 `json:"shed_fraction,omitempty"`
	// Limit and InFlight are an adaptive gate's concurrency limit and the
	// requests under it.
	Limit    *int `json:"limit,omitempty"`
	InFlight *int `json:"inflight,omitempty"`
	// Queue is a wait queue's length and oldest waiter's age.
	Queue *liveQueue `json:"queue,omitempty"`
	// Failures counts the decisions the gate's store could not make, each
	// decided by FailurePolicy.
	Failures      *int64 `json:"store_failures,omitempty"`
	FailurePolicy string `json:"failure_policy,omitempty"`
	// State is what the gate reports for the admin API (StateReporter).
	State any `json:"state,omitempty"`
}

type liveQueue struct {
	Waiting       int                 `json:"waiting"`
	OldestSeconds float64             `json:"oldest_seconds"`
	Waited        int64               `json:"waited"`
	Dropped       int64               `json:"dropped"`
	Classes       []sluice.ClassQueue `json:"classes,omitempty"`
}

// liveHandlers adds the page, GET /v1/live and its history to mux, and
// starts taking the history's readings.
func (s *Host) liveHandlers(mux *http.ServeMux) {
	s.hist.start(func() live { return s.live(DefaultLiveTenants) })
	page, _ := fs.Sub(liveFiles, "live")
	files := http.StripPrefix("/live/", http.FileServerFS(page))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/live/", http.StatusFound)
	})
	mux.HandleFunc("GET /live/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", liveCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/live/history", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, map[string][]live{"readings": s.hist.readings()})
	})
	mux.HandleFunc("GET /v1/live", func(w http.ResponseWriter, r *http.Request) {
		n := DefaultLiveTenants
		if q := r.URL.Query().Get("n"); q != "" {
			v, err := strconv.Atoi(q)
			if err != nil || v < 1 || v > metrics.DefaultTopTenants {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "n: want the tenants to list, 1 to " + strconv.Itoa(metrics.DefaultTopTenants)})
				return
			}
			n = v
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, s.live(n))
	})
}

// historyLen is how many readings the history keeps: five minutes at one a
// second, as the page shows.
const historyLen = 300

// history keeps the last historyLen readings of /v1/live, taken every
// second from when the admin handler is built until Close, so that the live
// page opens on the last minutes instead of empty charts. It holds at most
// historyLen readings (a few KiB each: the classes, 10 tenants of each top,
// the gates).
type history struct {
	mu   sync.Mutex
	ring []live // in order from next when full
	next int
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

// start takes a reading with read now and every second after, until close.
func (h *history) start(read func() live) {
	h.once.Do(func() {
		h.stop, h.done = make(chan struct{}), make(chan struct{})
		h.add(read())
		go func() {
			defer close(h.done)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-h.stop:
					return
				case <-t.C:
					h.add(read())
				}
			}
		}()
	})
}

// close stops the readings (if they started) and waits for the last.
func (h *history) close() {
	h.once.Do(func() {}) // a start after close starts nothing
	if h.stop != nil {
		close(h.stop)
		<-h.done
		h.stop = nil
	}
}

func (h *history) add(l live) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) < historyLen {
		h.ring = append(h.ring, l)
		return
	}
	h.ring[h.next] = l
	h.next = (h.next + 1) % historyLen
}

// readings returns the kept readings, oldest first.
func (h *history) readings() []live {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]live, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	return append(out, h.ring[:h.next]...)
}

// live reads the metrics and the gates now.
func (s *Host) live(n int) live {
	out := live{Time: time.Now().UTC(), Policy: s.Version(), Classes: s.metrics.Classes(),
		Tenants: liveTenants{Rejected: s.metrics.TopRejected(n), Consumed: s.metrics.TopConsumed(n)},
		Gates:   s.liveGates(), Totals: map[string]int64{}}
	for _, c := range out.Classes {
		out.Totals["offered"] += c.Offered
		out.Totals["admitted"] += c.Admitted
		out.Totals["useful"] += c.Completed["useful"]
		out.Totals["consumed_units"] += c.Units["consumed"]
		out.Totals["inflight"] += c.InFlight
		for _, v := range c.Rejected {
			out.Totals["rejected"] += v
		}
	}
	return out
}

func (s *Host) liveGates() []liveGate {
	c := s.Chain()
	now := c.Clock().Now()
	out := []liveGate{} // [] in JSON, not null, for a policy without gates
	for _, g := range c.Gates() {
		m, _ := c.Mode(g.Name())
		lg := liveGate{Name: g.Name(), Mode: m.String()}
		if l, ok := sluice.As[sluice.Leveler](g); ok {
			lv, _ := l.Levels(now)
			lg.Level = lv.String()
		}
		if sh, ok := sluice.As[sluice.Shedder](g); ok {
			f := sh.ShedFraction(now)
			lg.ShedFraction = &f
		}
		if sz, ok := sluice.As[sluice.Sizer](g); ok {
			l, n := sz.ConcurrencyLimit()
			lg.Limit, lg.InFlight = &l, &n
		}
		if qu, ok := sluice.As[sluice.Queuer](g); ok {
			n, oldest, waited, dropped := qu.QueueStats(now)
			lg.Queue = &liveQueue{Waiting: n, OldestSeconds: oldest.Seconds(), Waited: waited, Dropped: dropped}
			if cq, ok := sluice.As[sluice.ClassQueuer](g); ok {
				lg.Queue.Classes = cq.ClassQueues(now)
			}
		}
		if f, ok := sluice.As[sluice.FailureCounter](g); ok {
			n := f.Failures()
			lg.Failures, lg.FailurePolicy = &n, f.FailurePolicy()
		}
		if a, ok := sluice.As[sluice.StateReporter](g); ok {
			lg.State = a.ReportState(now)
		}
		out = append(out, lg)
	}
	return out
}
