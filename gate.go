package sluice

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Permit is a gate's opaque handle on what it holds for one admitted request
// (a concurrency slot, tokens that may be refunded, a fleet permit id). Gates
// that hold nothing return 0. The Chain hands the permit back to the same
// gate's Release exactly once.
type Permit uint64

// Gate decides admission for one request. Implementations must be safe for
// concurrent use and must not block longer than the request's deadline.
//
// Decide is called with the Chain's clock reading now and writes its
// verdict to *d, which is the zero Decision on entry and belongs to the
// caller: a gate fills it in place (the Chain keeps it where the request's
// ticket lives, so no verdict is copied on the decision path) and keeps no
// pointer to it after returning. When it admits, the Chain later calls
// Release exactly once with the returned Permit: with OutcomeRejected if a
// later gate rejected the request, or with the work's outcome when its
// Ticket is done. A rejecting Decide must hold nothing and return 0;
// Release is not called for it.
//
// A gate that spends its quota at admission and holds nothing while the
// work runs (a rate limit: its tokens are gone once taken) may say so
// with a method SpendsAtAdmission() bool that reports true. Its Release
// must then act only on a refusal by a later gate (OutcomeRejected) and on
// a completion that carries the work's actual cost (Completion.Cost): the
// Chain does not call it on other completions, and a Chain whose gates all
// spend at admission, and that has no Observer, reads no clock when work
// ends. The method is asked of the gate itself, not through wrappers (As):
// a wrapper that holds something of its own (a wait queue) does not spend
// at admission because the gate inside does; one that holds nothing
// forwards the question.
type Gate interface {
	// Name is the gate's unique name within a chain, e.g. "request-rate".
	Name() string
	// Decide writes the gate's verdict on r to *d and returns, when it
	// admits, its permit.
	Decide(ctx context.Context, r *Request, now clock.Instant, d *Decision) Permit
	// Release ends the hold taken by an admitting Decide.
	Release(r *Request, p Permit, c Completion)
}

// spender is the optional method of a Gate that spends its quota at
// admission (see Gate).
type spender interface {
	SpendsAtAdmission() bool
}

// Policy describes a gate's quota for the RateLimit-Policy header field: a
// name, a quota in Unit, the window in which a used quota comes back (0 for
// concurrency limits), and what it is counted over.
type Policy struct {
	Name   string
	Quota  int64
	Window time.Duration
	Unit   Unit
	// Scope is what the quota is counted over. Only a quota counted per
	// caller (Scope.PerCaller) is advertised to callers: one shared by all
	// of them protects capacity, and its remaining count is everyone's.
	Scope Scope
}

// Mode is a gate's run-time switch.
type Mode uint32

const (
	// ModeEnforce: the gate's rejections reject the request.
	ModeEnforce Mode = iota
	// ModeShadow: the gate decides and its would-be rejections are recorded,
	// but the request passes (the dark launch).
	ModeShadow
	// ModeOff: the gate is skipped entirely (the kill switch).
	ModeOff
)

var modeNames = [...]string{"enforce", "shadow", "off"}

// String returns "enforce", "shadow" or "off".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "unknown"
}

// ParseMode parses "enforce", "shadow" or "off". The error lists the names.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("sluice: mode %q is not one of %s", s, strings.Join(modeNames[:], ", "))
}
