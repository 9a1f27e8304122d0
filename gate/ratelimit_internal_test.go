package gate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// scripted is a store.Limiter whose every Take answers res, h and err.
type scripted struct {
	res limit.Result
	h   store.Handle
	err error
}

func (s *scripted) Take(context.Context, string, clock.Instant, int64, clock.Instant) (limit.Result, store.Handle, error) {
	return s.res, s.h, s.err
}
func (s *scripted) Refund(context.Context, string, store.Handle, clock.Instant, int64) error {
	return nil
}
func (s *scripted) Limit() int64          { return s.res.Limit }
func (s *scripted) Window() time.Duration { return time.Second }

// TestRateGateDecidesAsBase: the rate gate's Decide, written out for its
// admitted path, decides as the shared base.decide does for every store
// answer (each status, a failed store under each failure policy, with and
// without a fallback that answers).
func TestRateGateDecidesAsBase(t *testing.T) {
	down := errors.New("store down")
	answers := []scripted{
		{res: limit.Result{Status: limit.Allowed, Limit: 10, Remaining: 7, ResetAfter: 300 * time.Millisecond}, h: 5},
		{res: limit.Result{Status: limit.Allowed, Limit: 10, Remaining: 0}, h: 0},
		{res: limit.Result{Status: limit.Denied, Limit: 10, RetryAfter: 40 * time.Millisecond, ResetAfter: time.Second}},
		{res: limit.Result{Status: limit.Denied, Limit: 10}},
		{res: limit.Result{Status: limit.Exceeded, Limit: 10}},
		{res: limit.Result{Status: limit.Invalid}},
		{res: limit.Result{Status: limit.TooLate, Limit: 10}},
		{err: down},
	}
	fallbacks := []store.Limiter{nil,
		&scripted{res: limit.Result{Status: limit.Allowed, Limit: 3, Remaining: 2}, h: 9},
		&scripted{res: limit.Result{Status: limit.Denied, Limit: 3, RetryAfter: time.Second}},
		&scripted{err: down},
	}
	for _, a := range answers {
		for _, policy := range []FailurePolicy{FailOpen, FailClosed, LocalFallback} {
			for _, fb := range fallbacks {
				for _, answered := range []bool{false, true} {
					opts := Options{Scope: sluice.ScopeTenant, OnFailure: policy, Fallback: fb, RetryHint: 250 * time.Millisecond}
					if opts.validate("rate") != nil {
						continue
					}
					lim := a
					g, _ := NewRateLimit("rate", &lim, opts)
					rl := g.(*rateLimit)
					ref := &rateLimit{newBase("rate", &lim, opts, opts.reasonOr(sluice.ReasonPolicyRate), sluice.UnitRequests)}
					ref.ledger = newLedger(&lim, &opts, ref.refills)
					rl.answered.Store(answered)
					ref.answered.Store(answered)
					r := sluice.Request{Tenant: "t", Cost: 2}
					var got, want sluice.Decision
					pg := rl.Decide(context.Background(), &r, 100, &got)
					pw := ref.decide(context.Background(), &r, 100, r.Cost, &want)
					if got != want || pg != pw || rl.answered.Load() != ref.answered.Load() {
						t.Errorf("answer %+v, policy %v, fallback %v, answered %v:\nDecide %+v permit %d\nbase   %+v permit %d",
							a, policy, fb != nil, answered, got, pg, want, pw)
					}
				}
			}
		}
	}
}
