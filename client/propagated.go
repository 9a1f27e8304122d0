package client

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-go/sluice"
)

// levels are the degradation levels by name.
var levels = []string{sluice.LevelNormal.String(), sluice.LevelDegrade.String(), sluice.LevelShed.String(), sluice.LevelRecover.String()}

// Propagated returns r's context carrying what the sluice in front of this
// service (sluice proxy, which sets these fields on every request it
// forwards and drops the client's own) admitted r as: its class
// (sluice.ClassHeader), its degradation level (sluice.LevelHeader) and,
// when deadlineHeader is set and r has it ("250ms", as sluice writes
// it), a deadline that much after now. A Transport sending a call with
// that context (or a request made with it) passes them on, the budget
// reduced by the time spent here. Call cancel when the work is done.
//
// Use it only behind a sluice that propagates: anyone else could put any
// value in these fields. A malformed value is ignored.
func Propagated(r *http.Request, deadlineHeader string) (ctx context.Context, cancel context.CancelFunc) {
	ctx = r.Context()
	if c := r.Header.Get(sluice.ClassHeader); c != "" {
		ctx = sluice.ContextWithClass(ctx, c)
	}
	if i := slices.Index(levels, r.Header.Get(sluice.LevelHeader)); i > 0 {
		ctx = sluice.ContextWithLevel(ctx, sluice.Level(i))
	}
	if deadlineHeader != "" {
		if d, err := time.ParseDuration(r.Header.Get(deadlineHeader)); err == nil && d > 0 {
			return context.WithTimeout(ctx, d)
		}
	}
	return context.WithCancel(ctx)
}
