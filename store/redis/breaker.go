package redis

import (
	"context"
	"strconv"
	"sync/atomic"
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// breaker guards the calls to one Redis master (or, with an empty addr,
// to the whole store). Open, its decisions fail fast with ErrUnavailable
// and one background probe per Options.ProbeEvery tries the node again.
// On a Cluster each master has its own, so a dead master sends only its
// slots to the gates' failure policies while the others keep deciding on
// Redis.
type breaker struct {
	addr      string
	open      atomic.Bool
	openUntil atomic.Int64 // the clock.Instant before which no probe goes
	probing   atomic.Bool  // one probe at a time
}

// breakerFor returns the breaker that guards key: its slot's master's on a
// Cluster whose slot map is known, the store's own otherwise.
func (s *Store) breakerFor(key string) *breaker {
	if s.slots.Load() == nil {
		return &s.breaker
	}
	return s.breakerForSlot(keySlot(key))
}

// breakerForSlot returns the breaker of slot's master, or the store's own
// while the slot map is unknown.
func (s *Store) breakerForSlot(slot uint16) *breaker {
	if m := s.slots.Load(); m != nil {
		if b := m[slot]; b != nil {
			return b
		}
	}
	return &s.breaker
}

// refreshSlots reads the Cluster's slot map (CLUSTER SLOTS, from any
// node) and points each slot at its master's breaker, keeping the
// breakers (and their state) of masters already known. On error the
// previous map stays.
func (s *Store) refreshSlots(ctx context.Context) {
	entries, err := s.client.Do(ctx, s.client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return
	}
	var m [slotCount]*breaker
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]*breaker{}
	}
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			continue
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		master, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(master) < 2 || lo < 0 || hi >= slotCount || lo > hi {
			continue
		}
		host, err1 := master[0].ToString()
		port, err2 := master[1].AsInt64()
		if err1 != nil || err2 != nil {
			continue
		}
		addr := host + ":" + strconv.FormatInt(port, 10)
		b := s.nodes[addr]
		if b == nil {
			b = &breaker{addr: addr}
			s.nodes[addr] = b
		}
		for slot := lo; slot <= hi; slot++ {
			m[slot] = b
		}
	}
	s.slots.Store(&m)
}

// owns reports whether b guards at least one slot of the current map.
func (s *Store) owns(b *breaker) bool {
	m := s.slots.Load()
	if m == nil {
		return false
	}
	for _, x := range m {
		if x == b {
			return true
		}
	}
	return false
}
