package metrics

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/topk"
)

// The tenant label values of /metrics are capped (Options.MaxTenants) and
// earned by admissions, so a tenant that is only ever rejected counts as
// "other" there. The live view also wants the tenants rejected most and
// those that consume most, whoever they are: two space-saving sketches
// (package internal/topk) hold the heaviest tenants in bounded memory.

// DefaultTopTenants is Options.TopTenants' default.
const DefaultTopTenants = 64

// topTenantsBytes is an upper bound of the memory the two tenant sketches
// of Metrics hold for a TopTenants of n (61 KiB for the default, 64):
// it does not grow with the number of tenants seen.
func topTenantsBytes(n int) int {
	if n <= 0 {
		return 0
	}
	return topk.Bytes(n, sluice.ReasonCount) + topk.Bytes(n, int(sluice.OutcomeRejected)+1)
}

// TenantTop is a reading of the heaviest tenants of one measure.
type TenantTop struct {
	// Capacity is the most tenants the sketch holds.
	Capacity int `json:"capacity"`
	// Total is the whole measure over every tenant: rejections, or
	// consumed demand units.
	Total int64 `json:"total"`
	// Tenants are the heaviest, first the heaviest.
	Tenants []TenantCount `json:"tenants"`
}

// TenantCount is one tenant of a TenantTop. Count is an upper bound of
// the tenant's true total since the process started and Count-Error a
// lower bound; Error is at most Total/Capacity, and every tenant with more
// than Total/Capacity is listed (Metwally et al. 2005). A tenant's Count
// never decreases, so two readings' difference is a rate.
type TenantCount struct {
	// Tenant is the tenant's label (Options.TenantLabel: by default a
	// digest, never the key).
	Tenant string `json:"tenant"`
	Count  int64  `json:"count"`
	Error  int64  `json:"error"`
	// By splits what was counted since the tenant entered the sketch
	// (Count-Error of it): by reason for rejections, by outcome for
	// consumed units. Zero parts are left out.
	By map[string]int64 `json:"by,omitempty"`
}

// tenantSketches are the live view's tenant sketches; nil when
// Options.TopTenants is negative.
type tenantSketches struct {
	rejected, consumed *topk.Sketch
}

func newTenantSketches(n int) *tenantSketches {
	if n < 0 {
		return nil
	}
	if n == 0 {
		n = DefaultTopTenants
	}
	return &tenantSketches{rejected: topk.New(n, sluice.ReasonCount), consumed: topk.New(n, int(sluice.OutcomeRejected)+1)}
}

// sketchKey is the key a tenant is kept under: itself, or its label
// (marked by a leading NUL byte) when it is too long to keep or starts
// with a NUL byte itself.
func (m *Metrics) sketchKey(t string) string {
	if len(t) < topk.MaxKeyBytes && (t == "" || t[0] != 0) {
		return t
	}
	return "\x00" + m.label(t)
}

// labelOf turns a sketch key back into the tenant's label.
func (m *Metrics) labelOf(key string) string {
	if len(key) > 0 && key[0] == 0 {
		return key[1:]
	}
	return m.label(key)
}

// TenantKey returns the tenant (often an API key) whose label is label,
// if these metrics hold it: a tenant with a label slot on /metrics, or one
// the live view's sketches keep (those rejected or consuming most). It is
// for an operator's authenticated lookup, never for a log or a metric.
// A tenant known only by a digest (too long to keep whole) is not found.
// Cost: a walk over the label slots and the sketches (at most
// Options.MaxTenants + 2·Options.TopTenants tenants).
func (m *Metrics) TenantKey(label string) (string, bool) {
	var key string
	m.tenants.Range(func(k, v any) bool {
		if v.(*tenantLabel).label == label {
			key = k.(string)
			return false
		}
		return true
	})
	if key != "" {
		return key, true
	}
	if m.top == nil {
		return "", false
	}
	for _, s := range []*topk.Sketch{m.top.rejected, m.top.consumed} {
		entries, _ := s.Top(s.Capacity())
		for _, e := range entries {
			if (e.Key == "" || e.Key[0] != 0) && m.label(e.Key) == label {
				return e.Key, true
			}
		}
	}
	return "", false
}

// TopRejected returns the n tenants with the most rejections (enforced
// ones: shadow-mode would-be rejections are not counted), by reason.
func (m *Metrics) TopRejected(n int) TenantTop {
	if m.top == nil {
		return TenantTop{}
	}
	return m.read(m.top.rejected, n, func(i int) string { return sluice.Reason(i).String() })
}

// TopConsumed returns the n tenants whose finished work consumed the
// most demand units (what sluice_demand_units_total{stage="consumed"}
// counts), by outcome.
func (m *Metrics) TopConsumed(n int) TenantTop {
	if m.top == nil {
		return TenantTop{}
	}
	return m.read(m.top.consumed, n, func(i int) string { return sluice.Outcome(i).String() })
}

func (m *Metrics) read(s *topk.Sketch, n int, part func(int) string) TenantTop {
	entries, total := s.Top(n)
	top := TenantTop{Capacity: s.Capacity(), Total: total, Tenants: make([]TenantCount, len(entries))}
	for i, e := range entries {
		tc := TenantCount{Tenant: m.labelOf(e.Key), Count: e.Count, Error: e.Err}
		for j, v := range e.Parts {
			if v != 0 {
				if tc.By == nil {
					tc.By = map[string]int64{}
				}
				tc.By[part(j)] = v
			}
		}
		top.Tenants[i] = tc
	}
	return top
}

// ClassCounts is what the metrics counted for one class since the process
// started: the sums over tenants of the series of /metrics that carry
// the class label, read from the same counters.
type ClassCounts struct {
	Class    string `json:"class"`
	Offered  int64  `json:"offered"`
	Admitted int64  `json:"admitted"`
	// Completed is by outcome (useful, late, errored, cancelled, rejected).
	Completed map[string]int64 `json:"completed"`
	// Rejected is the enforced rejections by reason; Shadow the would-be
	// rejections of gates in shadow mode, by reason.
	Rejected map[string]int64 `json:"rejected"`
	Shadow   map[string]int64 `json:"shadow,omitempty"`
	// Units is demand units by stage: offered, admitted, rejected, consumed.
	Units map[string]int64 `json:"units"`
	// Goodput is the demand units of useful completions.
	Goodput int64 `json:"goodput_units"`
	// InFlight is the admitted requests not yet done.
	InFlight int64 `json:"inflight"`
}

// Classes returns the counts of every class seen, in class order. It
// reads the counters /metrics serves, so a scrape taken before it shows
// no more and one taken after no less (except when the series of a tenant
// idle for Options.TenantIdle are removed: both then drop by its counts).
func (m *Metrics) Classes() []ClassCounts {
	byClass := map[string]*ClassCounts{}
	get := func(class string) *ClassCounts {
		c, ok := byClass[class]
		if !ok {
			c = &ClassCounts{Class: class, Completed: map[string]int64{}, Rejected: map[string]int64{}, Units: map[string]int64{}}
			byClass[class] = c
		}
		return c
	}
	collect(m.offered, func(l map[string]string, v int64) { get(l["class"]).Offered += v })
	collect(m.admitted, func(l map[string]string, v int64) { get(l["class"]).Admitted += v })
	collect(m.completed, func(l map[string]string, v int64) { get(l["class"]).Completed[l["outcome"]] += v })
	collect(m.goodput, func(l map[string]string, v int64) { get(l["class"]).Goodput += v })
	collect(m.units, func(l map[string]string, v int64) { get(l["class"]).Units[l["stage"]] += v })
	collect(m.inflight, func(l map[string]string, v int64) { get(l["class"]).InFlight += v })
	collect(m.rejected, func(l map[string]string, v int64) {
		c := get(l["class"])
		if l["mode"] == "shadow" {
			if c.Shadow == nil {
				c.Shadow = map[string]int64{}
			}
			c.Shadow[l["reason"]] += v
			return
		}
		c.Rejected[l["reason"]] += v
	})
	out := make([]ClassCounts, 0, len(byClass))
	for _, c := range byClass {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ClassCounts) int { return cmp.Compare(a.Class, b.Class) })
	return out
}

// collect calls f with the labels and value of every series of c (a
// counter or gauge vector of whole numbers).
func collect(c prometheus.Collector, f func(labels map[string]string, v int64)) {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for pm := range ch {
		var d dto.Metric
		if pm.Write(&d) != nil {
			continue
		}
		labels := make(map[string]string, len(d.Label))
		for _, lp := range d.Label {
			labels[lp.GetName()] = lp.GetValue()
		}
		v := d.GetCounter().GetValue() + d.GetGauge().GetValue()
		f(labels, int64(v))
	}
}
