package memory

import (
	"hash/maphash"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

// Options configures the table of a Keyed. The zero value is valid.
type Options struct {
	// MaxKeys caps the keys held. Default 1,048,576. At the cap a key costs
	// 128 bytes of heap (a 64-byte slot in an array kept between half and
	// three quarters full), plus its bytes if longer than 28, and about 192
	// bytes resident while the Go runtime keeps the smaller arrays the table
	// outgrew (measured, TestKeyCostAtTheCap): the default bounds a table
	// near 128 MB of heap, 200 MB resident.
	// The cap is split evenly across shards, so a shard may fill a little
	// before the table does.
	MaxKeys int
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Default 16 per CPU (GOMAXPROCS), at least 16: enough
	// that decisions on different keys rarely contend, few enough that each
	// shard's slot array is large enough for huge pages.
	Shards int
	// SweepEvery is the least time between two sweeps of one shard for fresh
	// keys when that shard is at its cap. Default 1 s.
	SweepEvery time.Duration
}

const (
	// DefaultMaxKeys is the key cap when Options name none.
	DefaultMaxKeys    = 1 << 20
	defaultSweepEvery = time.Second
)

// table holds one state S per key for millions of keys. It is sharded by a
// seeded hash of the key; each shard is an open-addressing hash table
// (linear probing, backward-shift deletion) under its own mutex, so
// decisions on different keys rarely contend and a decision on an existing
// key allocates nothing.
//
// Bounded cardinality: a table never holds more than about MaxKeys keys.
// When a new key arrives at a full shard, the shard first drops every key
// whose state is fresh (equal to a new key's state, so dropping it changes
// no decision), at most once per SweepEvery. If the shard is still full,
// it evicts one key (evictLocked) so that a new tenant gets its own state
// however many keys a flood of others brought: of 16 keys sampled, one
// used only once goes before any used more (a flood of one-shot keys
// churns among itself while established tenants keep their state), the
// longest idle first. An evicted key starts fresh if it returns: it can
// gain at most one quota per eviction, and only while more distinct keys
// arrive than the table holds. Keys whose state may not be forgotten (a
// concurrency count with requests in flight) are never evicted; a new key
// finding only those shares the shard's overflow state (more strictly
// limited, never less), which overflows counts.
//
// A table is safe for concurrent use.
type table[S any] struct {
	shards     []shard[S]
	shift      uint // hash >> shift selects the shard
	sweepEvery time.Duration
	seed       maphash.Seed
	fresh      func(*S, clock.Instant) bool
	overflowed atomic.Int64
	evicted    atomic.Int64
	// forgettable reports whether a state may be evicted: false for
	// states whose loss would admit more than the limit (permits in
	// flight). Nil: every state.
	forgettable func(*S, clock.Instant) bool
}

// inlineKey is the longest key stored inside its slot. With a 16-byte
// state a slot is then exactly one 64-byte cache line, so a lookup of a
// short key costs one memory access; longer keys add one for their bytes.
const inlineKey = 28

type slot[S any] struct {
	hash  uint64          // 0 marks an empty slot
	klen  uint16          // at most sluice.MaxKeyLen
	use   uint16          // recency and frequency, for eviction (see touch)
	inl   [inlineKey]byte // the key, when klen ≤ inlineKey
	long  *byte           // the key's bytes, when klen > inlineKey
	state S
}

func (s *slot[S]) is(h uint64, key string) bool {
	if s.hash != h || int(s.klen) != len(key) {
		return false
	}
	if len(key) <= inlineKey {
		return string(s.inl[:len(key)]) == key
	}
	return unsafe.String(s.long, len(key)) == key
}

// touch records a use at now: the low 2 bits count uses (saturating at
// 3), the other 14 hold the second of the last one (wrapping every 4.5 h).
func (s *slot[S]) touch(now clock.Instant) {
	uses := min(s.use&3+1, 3)
	s.use = uint16(int64(now)/int64(time.Second))<<2 | uses
}

// idle returns the seconds since s's last use at now, modulo 2^14.
func (s *slot[S]) idle(now clock.Instant) int {
	return int((uint16(int64(now)/int64(time.Second)) - s.use>>2) & (1<<14 - 1))
}

func (s *slot[S]) setKey(key string) {
	s.klen = uint16(len(key))
	if len(key) <= inlineKey {
		copy(s.inl[:], key)
		return
	}
	s.long = unsafe.StringData(strings.Clone(key))
}

type shard[S any] struct {
	mu        sync.Mutex
	slots     []slot[S] // length is a power of two
	count     int
	cap       int // keys the shard holds at most
	maxSlots  int
	lastSweep clock.Instant
	swept     bool
	// floor is the latest instant at which the shard dropped a key: a
	// reading older than that (read before the drop, applied after it)
	// is moved up to it, so a dropped key's successor never starts at a
	// time the dropped state had already passed.
	floor    clock.Instant
	overflow S
	_        [64]byte // keep hot shard headers on separate cache lines
}

// newTable returns an empty table. fresh reports whether a state equals a
// new key's (zero) state at now; it is called under the shard lock.
func newTable[S any](opts Options, fresh func(s *S, now clock.Instant) bool) *table[S] {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Shards <= 0 {
		opts.Shards = max(16, 16*runtime.GOMAXPROCS(0))
	}
	if opts.SweepEvery <= 0 {
		opts.SweepEvery = defaultSweepEvery
	}
	n := 1 << bits.Len(uint(opts.Shards-1))
	t := &table[S]{
		shards:     make([]shard[S], n),
		shift:      uint(64 - bits.Len(uint(n-1))),
		sweepEvery: opts.SweepEvery,
		seed:       maphash.MakeSeed(),
		fresh:      fresh,
	}
	if n == 1 {
		t.shift = 63 // hash >> 63 is 0 or 1; masked below
	}
	t.setMaxKeys(opts.MaxKeys)
	return t
}

// setMaxKeys sets the key cap (0: DefaultMaxKeys), split evenly across the
// shards. Lowering it drops no key: a shard over its new cap takes new keys
// only as its keys become fresh.
func (t *table[S]) setMaxKeys(maxKeys int) {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	per := max((maxKeys+len(t.shards)-1)/len(t.shards), 1)
	maxSlots := 1 << bits.Len(uint(per*4/3)) // load factor at most 3/4 at the cap
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.cap, sh.maxSlots = per, max(maxSlots, len(sh.slots))
		sh.mu.Unlock()
	}
}

func (t *table[S]) hash(key string) uint64 {
	h := maphash.String(t.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

func (t *table[S]) shard(h uint64) *shard[S] {
	return &t.shards[(h>>t.shift)&uint64(len(t.shards)-1)]
}

// guard holds one shard's lock; Unlock must be called exactly once.
type guard[S any] struct{ sh *shard[S] }

// Unlock releases the shard lock.
func (g guard[S]) unlock() { g.sh.mu.Unlock() }

// lock locks the shard of key and returns the key's state and the instant
// to step it at: now, or the shard's floor if now is older. With create, a
// missing key is inserted with a zero (fresh) state, or, when its shard is
// full, the shard's overflow state is returned with overflow true; without
// create, a missing key returns nil. The pointer is valid until the guard is
// unlocked, which the caller must do exactly once.
func (t *table[S]) lock(key string, now clock.Instant, create bool) (s *S, at clock.Instant, overflow bool, g guard[S]) {
	h := t.hash(key)
	sh := t.shard(h)
	sh.mu.Lock()
	g = guard[S]{sh}
	at = sh.at(now)
	if i := sh.findLocked(h, key); i >= 0 {
		sh.slots[i].touch(at)
		return &sh.slots[i].state, at, false, g
	}
	if !create {
		return nil, at, false, g
	}
	if sh.count >= sh.cap {
		t.sweepLocked(sh, at)
		if sh.count >= sh.cap && !t.evictLocked(sh, h, at) {
			t.overflowed.Add(1)
			return &sh.overflow, at, true, g
		}
	}
	i := sh.insertLocked(h, key)
	sh.slots[i].touch(at)
	return &sh.slots[i].state, at, false, g
}

// lockOverflow locks the shard of key and returns that shard's overflow
// state (the state an earlier lock with create reported as overflow) and
// the instant to step it at, as lock does.
func (t *table[S]) lockOverflow(key string, now clock.Instant) (s *S, at clock.Instant, g guard[S]) {
	sh := t.shard(t.hash(key))
	sh.mu.Lock()
	return &sh.overflow, sh.at(now), guard[S]{sh}
}

// at returns the instant to step a state of sh at: now, or the floor when
// now is older by at most limit.ClockTolerance (a reading taken before the
// drop). A reading further back is a step of the clock, which the
// algorithms handle with what the states hold; the floor follows it, or
// every key of the shard would be stepped at the floor, its windows stuck
// there, until the clock caught up. REQUIRES: sh.mu held.
func (sh *shard[S]) at(now clock.Instant) clock.Instant {
	switch {
	case now >= sh.floor:
		return now
	case sh.floor.Sub(now) > limit.ClockTolerance:
		sh.floor = now
		return now
	}
	return sh.floor
}

// Len returns the number of keys held.
func (t *table[S]) size() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += sh.count
		sh.mu.Unlock()
	}
	return n
}

// Overflowed returns how many decisions used an overflow state.
func (t *table[S]) overflows() int64 { return t.overflowed.Load() }

// Sweep drops every fresh key at now from every shard and returns how many
// it dropped.
func (t *table[S]) sweep(now clock.Instant) int {
	dropped := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		before := sh.count
		t.dropFreshLocked(sh, now)
		dropped += before - sh.count
		sh.mu.Unlock()
	}
	return dropped
}

// findLocked returns the slot index of key, or -1. REQUIRES: sh.mu held.
func (sh *shard[S]) findLocked(h uint64, key string) int {
	if len(sh.slots) == 0 {
		return -1
	}
	mask := uint64(len(sh.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &sh.slots[i]
		if s.is(h, key) {
			return int(i)
		}
		if s.hash == 0 {
			return -1
		}
	}
}

// insertLocked stores a new key with a zero state and returns its index.
// REQUIRES: sh.mu held, key absent, sh.count below the table's cap.
func (sh *shard[S]) insertLocked(h uint64, key string) int {
	if (sh.count+1)*4 > len(sh.slots)*3 && len(sh.slots) < sh.maxSlots {
		sh.growLocked()
	}
	mask := uint64(len(sh.slots) - 1)
	i := h & mask
	for sh.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	sh.slots[i] = slot[S]{hash: h}
	sh.slots[i].setKey(key)
	sh.count++
	return int(i)
}

// growLocked doubles the slot array (starting at 8). REQUIRES: sh.mu held.
func (sh *shard[S]) growLocked() {
	old := sh.slots
	sh.slots = make([]slot[S], max(len(old)*2, 8))
	adviseHuge(unsafe.Pointer(&sh.slots[0]), uintptr(len(sh.slots))*unsafe.Sizeof(sh.slots[0]))
	mask := uint64(len(sh.slots) - 1)
	for j := range old {
		if old[j].hash == 0 {
			continue
		}
		i := old[j].hash & mask
		for sh.slots[i].hash != 0 {
			i = (i + 1) & mask
		}
		sh.slots[i] = old[j]
	}
}

// deleteLocked empties slot i and shifts the rest of its probe run back so
// lookups never stop early. REQUIRES: sh.mu held.
func (sh *shard[S]) deleteLocked(i int) {
	mask := len(sh.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		if sh.slots[j].hash == 0 {
			break
		}
		home := int(sh.slots[j].hash) & mask
		// Slot j may move to the hole at i only if its home is not
		// cyclically inside (i, j].
		if (i <= j && i < home && home <= j) || (i > j && (i < home || home <= j)) {
			continue
		}
		sh.slots[i] = sh.slots[j]
		i = j
	}
	sh.slots[i] = slot[S]{}
	sh.count--
}

// evictSample is how many keys eviction compares.
const evictSample = 16

// evictLocked deletes one key of a full shard to make room for a new one
// with hash h: of the first evictSample keys from h's home slot on, one
// used only once before any used more, the longest idle first, skipping
// keys that may not be forgotten. It reports whether it deleted one.
// REQUIRES: sh.mu held.
func (t *table[S]) evictLocked(sh *shard[S], h uint64, now clock.Instant) bool {
	mask := uint64(len(sh.slots) - 1)
	victim, best := -1, -1
	for i, seen := h&mask, 0; seen < evictSample && seen < sh.count; i = (i + 1) & mask {
		s := &sh.slots[i]
		if s.hash == 0 {
			continue
		}
		seen++
		if t.forgettable != nil && !t.forgettable(&s.state, now) {
			continue
		}
		score := s.idle(now) // longest idle first
		if s.use&3 <= 1 {
			score += 1 << 15 // seen once: before any key seen more
		}
		if score > best {
			victim, best = int(i), score
		}
	}
	if victim < 0 {
		return false
	}
	sh.floor = max(sh.floor, now) // the evicted key's successor starts no earlier
	sh.deleteLocked(victim)
	t.evicted.Add(1)
	return true
}

// sweepLocked drops fresh keys if the shard has not been swept within
// SweepEvery. REQUIRES: sh.mu held.
func (t *table[S]) sweepLocked(sh *shard[S], now clock.Instant) {
	if sh.swept && now.Sub(sh.lastSweep) < t.sweepEvery {
		return
	}
	sh.swept, sh.lastSweep = true, max(now, sh.lastSweep)
	t.dropFreshLocked(sh, now)
}

// dropFreshLocked deletes every key whose state is fresh at now. REQUIRES: sh.mu held.
func (t *table[S]) dropFreshLocked(sh *shard[S], now clock.Instant) {
	sh.floor = max(sh.floor, now)
	for i := 0; i < len(sh.slots); {
		s := &sh.slots[i]
		if s.hash != 0 && t.fresh(&s.state, now) {
			sh.deleteLocked(i) // re-examine i: a later key may have moved in
			continue
		}
		i++
	}
}
