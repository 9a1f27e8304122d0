package httpcore

import (
	"strconv"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// OutHeader is the header of a request on its way on: http.Header, and
// fasthttp's request header, have these methods.
type OutHeader interface {
	Set(key, value string)
	Del(key string)
}

// Propagate sets the decision on h, the header of the request the
// admitted one becomes upstream, as Config.Propagate says (whatever the
// config: a server calls it when it propagates).
func (a *Admission) Propagate(h OutHeader) {
	a.st.propagate(h, a.req.Class, a.dec.Level, a.req.Deadline)
}

// propagate sets class, level and the time left until deadline (0: none)
// on h, replacing what the client sent in those fields.
// (A header type may hold a field several times and Set only its first:
// each is deleted first.)
func (st *state) propagate(h OutHeader, class string, level sluice.Level, deadline clock.Instant) {
	h.Del(sluice.ClassHeader)
	h.Set(sluice.ClassHeader, class)
	h.Del(sluice.LevelHeader)
	if level != sluice.LevelNormal {
		h.Set(sluice.LevelHeader, level.String())
	}
	if dh := st.c.cfg.DeadlineHeader; dh != "" && deadline != 0 {
		h.Del(dh)
		h.Set(dh, remaining(deadline.Sub(st.chain.Clock().Now())))
	}
}

// remaining formats the time left of a budget for the deadline header:
// whole milliseconds, rounded down (a callee must not think it has more
// time than its caller), at least 1ms (a request that is out of time is
// one the callee refuses at once, not one without a deadline).
func remaining(d time.Duration) string {
	var b [24]byte
	return string(strconv.AppendInt(b[:0], max(int64(d/time.Millisecond), 1), 10)) + "ms"
}
