package httpcore

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// AccessLog is httpgate.AccessLog (documented there): a pointer to one
// converts to a pointer to the other.
type AccessLog struct {
	Logger           *slog.Logger
	RejectsPerSecond int
	TenantLabel      func(tenant string) string
}

// sampler counts one reason's rejections in the current second.
type sampler struct {
	sec        atomic.Int64 // the second of the chain's clock n counts in
	n          atomic.Int64 // rejections of the second so far
	suppressed atomic.Int64 // rejections left out since the last line
}

// take reports whether a rejection in second sec is logged, under limit
// lines a second, and if so how many were left out before it. Two
// rejections racing at a second's turn may let one line more or fewer
// through; the counts stay exact.
func (s *sampler) take(sec, limit int64) (bool, int64) {
	if cur := s.sec.Load(); cur != sec && s.sec.CompareAndSwap(cur, sec) {
		s.n.Store(0)
	}
	if s.n.Add(1) > limit {
		s.suppressed.Add(1)
		return false, 0
	}
	return true, s.suppressed.Swap(0)
}

// logRejected writes the access line of a rejection, if the sample takes it.
// method and path are the request's (the original request's, for a
// decision endpoint).
func (m *Middleware) logRejected(al *AccessLog, now clock.Instant, r *http.Request, method, path string, req *sluice.Request, d *sluice.Decision, status int, rid string, wait time.Duration) {
	m.logRejectedAt(al, now, r.Context(), r.RemoteAddr, method, path, req, d, status, rid, wait)
}

// logRejectedAt is logRejected of a request known by its context and
// remote address. wait is how long the decision took when 100 µs or more
// (a wait in a gate's queue, or paced), else 0: the line's time less wait
// is when the request arrived (sluice whatif replays it then).
func (m *Middleware) logRejectedAt(al *AccessLog, now clock.Instant, ctx context.Context, remote, method, path string, req *sluice.Request, d *sluice.Decision, status int, rid string, wait time.Duration) {
	suppressed := int64(0)
	if limit := int64(al.RejectsPerSecond); limit >= 0 {
		var ok bool
		if ok, suppressed = m.samples[d.Reason%sluice.Reason(sluice.ReasonCount)].take(int64(now)/int64(time.Second), max(limit, 1)); !ok {
			return
		}
	}
	attrs := make([]slog.Attr, 0, 15)
	attrs = append(attrs, slog.String("decision", "rejected"), slog.String("method", method), slog.String("path", path),
		slog.Int("status", status), slog.String("reason", d.Reason.String()), slog.String("gate", d.Gate),
		slog.String("scope", d.Scope.String()), slog.String("request_id", rid))
	attrs = requestAttrs(attrs, al, remote, req)
	if wait > 0 {
		attrs = append(attrs, slog.Duration("wait", wait))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	al.Logger.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
}

// logAdmitted writes the access line of an admitted request whose handler
// returned.
func logAdmitted(al *AccessLog, took time.Duration, r *http.Request, method, path string, req *sluice.Request, status int, wait time.Duration) {
	logAdmittedAt(al, took, r.Context(), r.RemoteAddr, method, path, req, status, wait)
}

// logAdmittedAt is logAdmitted of a request known by its context and
// remote address. took is from the decision to the answer, wait how long
// the decision took (0: under 100 µs): the request arrived took + wait
// before the line's time.
func logAdmittedAt(al *AccessLog, took time.Duration, ctx context.Context, remote, method, path string, req *sluice.Request, status int, wait time.Duration) {
	if status == 0 {
		status = http.StatusOK // the handler wrote nothing: net/http answers 200
	}
	attrs := make([]slog.Attr, 0, 13)
	attrs = append(attrs, slog.String("decision", "admitted"), slog.String("method", method), slog.String("path", path),
		slog.Int("status", status), slog.Duration("duration", took))
	attrs = requestAttrs(attrs, al, remote, req)
	if wait > 0 {
		attrs = append(attrs, slog.Duration("wait", wait))
	}
	al.Logger.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
}

func requestAttrs(attrs []slog.Attr, al *AccessLog, remote string, req *sluice.Request) []slog.Attr {
	attrs = append(attrs, slog.String("remote", remote), slog.String("class", req.Class),
		slog.String("operation", req.Operation), slog.Int64("cost", max(req.Cost, 1)))
	if al.TenantLabel != nil {
		attrs = append(attrs, slog.String("tenant", al.TenantLabel(req.Tenant)))
	}
	return attrs
}

// waitFrom is when a decision whose wait the access log records began:
// now when the log is on and a gate of the chain may wait, else 0.
func (st *state) waitFrom() clock.Instant {
	if st.c.cfg.AccessLog == nil || !st.chain.MayWait() {
		return 0
	}
	return st.chain.Clock().Now()
}

// waited is how long a decision that began at from (waitFrom) took by
// now: its wait in a gate's queue or pacing, and on a busy host the host's
// own delays; 0 below 100 µs, which whatif needs no finer.
func waited(from, now clock.Instant) time.Duration {
	if from == 0 {
		return 0
	}
	if d := now.Sub(from); d >= 100*time.Microsecond {
		return d
	}
	return 0
}
