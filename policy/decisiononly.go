package policy

import "fmt"

// CheckDecisionOnly reports the gates of f that cannot be enforced where
// sluice only decides and never sees the work: a decision endpoint
// (httpgate.DecisionHandler behind nginx auth_request or Envoy ext_authz,
// as `sluice serve` runs it) does each admitted request's Ticket as soon
// as it has answered, since neither proxy reports when the upstream's
// response ends. Rate gates (token_bucket, gcra, fixed_window,
// sliding_window, sliding_log, leaky_bucket, a reservation of capacity)
// count admissions and decide there exactly as in process. A gate that
// holds a slot until the work ends (concurrency, a reservation of
// inflight units, a wait queue), or that learns from completed work or
// measures this process (adaptive_concurrency, deadline, fleet_usage,
// utilization, ladder), would see every request end at once and protect
// nothing.
//
// It returns nil, or Errors with one entry per such gate, at the gate's
// kind line, whatever the gate's mode (the admin API could switch an off
// gate on). f must be a parsed file (Parse or Load).
func CheckDecisionOnly(f *File) error {
	var es Errors
	for i := range f.Gates {
		g := &f.Gates[i]
		why := afterWork(g)
		if why == "" {
			continue
		}
		es = append(es, &Error{File: f.Path, Line: g.fieldLine("kind"), Field: fmt.Sprintf("gates[%d].kind", i),
			Msg: fmt.Sprintf("%s (%s) %s, and a decision endpoint (nginx auth_request, Envoy ext_authz) never learns when a request ends: "+
				"it would see every request end at once; keep only rate gates in a policy that sluice serve decides with", g.Name, g.Kind, why)})
	}
	if len(es) == 0 {
		return nil
	}
	return es
}

// workBound is a kind whose gates' decisions may depend on when admitted
// work ends or on this process: afterWork says why, or "" when these
// settings do not. A kind says so in its own file.
type workBound interface {
	afterWork() string
}

// afterWork says why g's decisions depend on when admitted work ends or on
// this process, or "" when they do not.
func afterWork(g *Gate) string {
	if w, ok := g.params.(workBound); ok {
		return w.afterWork()
	}
	return ""
}
