package sim

import "math/bits"

// wheel is a timing wheel for the events that are many and near: the
// callers' timeouts. Events go into 1 ms slots of a ring covering
// wheelSlots ms from the slot that holds the present; each slot is
// unordered and small, and a bitmap finds the next non-empty slot. The
// engine takes the earlier of the wheel's and the heap's next event, so
// order is exactly (at, seq) as if one heap held everything; an event
// beyond the ring's horizon goes to the heap instead.
type wheel struct {
	slots [wheelSlots][]event
	used  [wheelSlots / 64]uint64
	base  int64 // start of the slot the present is in (ns, a multiple of 1 ms)
	n     int
	// the earliest event's place, valid while memo is set
	memoSlot, memoIdx int
	memo              bool
}

const (
	wheelSlots = 1 << 13 // 8.192 s of 1 ms slots
	slotNs     = 1_000_000
)

// add files e, or reports false when e is beyond the horizon. e.at must not
// be before the present.
func (w *wheel) add(e event) bool {
	if e.at >= w.base+wheelSlots*slotNs {
		return false
	}
	i := int(e.at/slotNs) % wheelSlots
	if w.memo {
		m := w.slots[w.memoSlot][w.memoIdx]
		if e.at < m.at || e.at == m.at && e.seq < m.seq {
			w.memo = false
		}
	}
	w.slots[i] = append(w.slots[i], e)
	w.used[i/64] |= 1 << (i % 64)
	w.n++
	return true
}

// advance moves the present to now (never backwards).
func (w *wheel) advance(now int64) {
	if b := now - now%slotNs; b > w.base {
		w.base = b
	}
}

// next returns the slot index holding the earliest event and the index of
// that event in the slot, or ok false when the wheel is empty.
func (w *wheel) next() (slot, idx int, ok bool) {
	if w.n == 0 {
		return 0, 0, false
	}
	if w.memo {
		return w.memoSlot, w.memoIdx, true
	}
	start := int(w.base/slotNs) % wheelSlots
	slot = w.firstUsed(start)
	s := w.slots[slot]
	idx = 0
	for k := 1; k < len(s); k++ {
		if s[k].at < s[idx].at || s[k].at == s[idx].at && s[k].seq < s[idx].seq {
			idx = k
		}
	}
	w.memoSlot, w.memoIdx, w.memo = slot, idx, true
	return slot, idx, true
}

// firstUsed returns the first non-empty slot at or after start, wrapping.
func (w *wheel) firstUsed(start int) int {
	word, bit := start/64, start%64
	if m := w.used[word] >> bit; m != 0 {
		return start + bits.TrailingZeros64(m)
	}
	for k := 1; k <= len(w.used); k++ {
		wi := (word + k) % len(w.used)
		if m := w.used[wi]; m != 0 {
			return wi*64 + bits.TrailingZeros64(m)
		}
	}
	panic("sim: wheel count and bitmap disagree")
}

// take removes and returns the event at slot, idx.
func (w *wheel) take(slot, idx int) event {
	s := w.slots[slot]
	e := s[idx]
	last := len(s) - 1
	s[idx] = s[last]
	w.slots[slot] = s[:last]
	if last == 0 {
		w.used[slot/64] &^= 1 << (slot % 64)
	}
	w.n--
	w.memo = false
	return e
}
