package sim

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The timing wheel plus the heap hand out events in exactly (at, seq)
// order, as one priority queue would, whatever mix of near timeouts, far
// timeouts (beyond the wheel's horizon) and other events is pending.
func TestEventOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e := &engine{}
		var now int64
		var model []event
		before := func(a, b event) bool { return a.at < b.at || a.at == b.at && a.seq < b.seq }
		for range rapid.IntRange(1, 400).Draw(t, "ops") {
			if len(model) == 0 || rapid.IntRange(0, 2).Draw(t, "op") > 0 {
				var d int64
				switch rapid.IntRange(0, 3).Draw(t, "range") {
				case 0:
					d = 0 // now: same slot, ties broken by seq
				case 1:
					d = rapid.Int64Range(0, 3*slotNs).Draw(t, "near")
				case 2:
					d = rapid.Int64Range(0, wheelSlots*slotNs+5*slotNs).Draw(t, "around the horizon")
				default:
					d = rapid.Int64Range(0, 60e9).Draw(t, "far")
				}
				kind := rapid.SampledFrom([]uint8{evTimeout, evTimeout, evFree, evRetry}).Draw(t, "kind")
				e.at(now+d, kind, 0, 0)
				model = append(model, event{at: now + d, seq: e.seq, kind: kind})
				continue
			}
			got, ok := e.next(math.MaxInt64)
			if !ok {
				t.Fatalf("empty with %d pending", len(model))
			}
			i := 0
			for k := range model {
				if before(model[k], model[i]) {
					i = k
				}
			}
			if want := model[i]; got.at != want.at || got.seq != want.seq {
				t.Fatalf("got (%d, %d), want (%d, %d)", got.at, got.seq, want.at, want.seq)
			}
			model = slices.Delete(model, i, i+1)
			now = got.at
			e.timers.advance(now)
		}
		// A bound before the earliest event stops the run without taking it.
		if len(model) > 0 {
			first := slices.MinFunc(model, func(a, b event) int {
				if before(a, b) {
					return -1
				}
				return 1
			})
			if _, ok := e.next(first.at); ok {
				t.Fatal("next returned an event at or after its end")
			}
			if got, ok := e.next(first.at + 1); !ok || got.seq != first.seq {
				t.Fatalf("after the bound: %v %v, want seq %d", got, ok, first.seq)
			}
		}
	})
}
