// Package topk keeps the heaviest keys of a stream in bounded memory, for
// the admin page's noisy-neighbour view: which tenants are rejected most,
// which consume most. It is the space-saving algorithm of Metwally,
// Agrawal and El Abbadi ("Efficient Computation of Frequent and Top-k
// Elements in Data Streams", ICDT 2005) with weighted updates: a table of
// at most Capacity counters; a key not in a full table takes the counter
// of the smallest one and inherits its count as its error.
//
//	s := topk.New(64, 2)
//	s.Add("tenant-a", 1, 0)
//	for _, e := range s.Top(10) {
//		fmt.Println(e.Key, e.Count, e.Err)
//	}
//
// Guarantees, for a stream of total weight W (the sum of every Add's
// weight): each entry's Count is at least the key's true weight and
// Count-Err at most; Err ≤ W/Capacity; every key whose true weight exceeds
// W/Capacity is in the table. A key's Count never decreases while the
// sketch lives, even across evictions (the smallest count only grows), so
// the difference between two readings is a rate an operator may plot.
package topk

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// MaxKeyBytes is the longest key a sketch stores. A longer key is the
// caller's to shorten (a digest): Add refuses it, so that Bytes holds.
const MaxKeyBytes = 256

// Sketch is a space-saving table. Its methods are safe for concurrent use;
// every Add takes one mutex for O(log Capacity) work and allocates only
// when a key enters the table (a copy of its string).
type Sketch struct {
	mu     sync.Mutex
	index  map[string]int32 // key → its slot
	slots  []slot           // where each key stays while it is held
	heap   []heapEntry      // the slots' counts, a min-heap
	parts  []int64          // slot i's at [i*nparts:]
	nparts int
	cap    int
	total  int64
}

type slot struct {
	key string
	err int64
	pos int // position in heap
}

// heapEntry is a slot's count, kept in the heap so that sifting reads
// one array.
type heapEntry struct {
	count int64
	slot  int32
}

// Entry is one key of a Top reading.
type Entry struct {
	Key string
	// Count is an upper bound of the key's total weight; Count-Err a lower
	// bound.
	Count, Err int64
	// Parts splits the weight added since the key entered the table
	// (Count-Err of it, exactly) by the part index given to Add.
	Parts []int64
}

// New returns a sketch of at most capacity keys (at least 1) whose
// weights are split into nparts parts (at least 1).
func New(capacity, nparts int) *Sketch {
	capacity, nparts = max(capacity, 1), max(nparts, 1)
	return &Sketch{index: make(map[string]int32, capacity), slots: make([]slot, 0, capacity), heap: make([]heapEntry, 0, capacity),
		parts: make([]int64, capacity*nparts), nparts: nparts, cap: capacity}
}

// Capacity returns the most keys the sketch holds.
func (s *Sketch) Capacity() int { return s.cap }

// Bytes is an upper bound of the memory a sketch of this capacity and
// parts holds, whatever the stream: its table (32 bytes a slot and 16 of
// heap), its parts (8 bytes each), its index (a Go map of at most capacity
// keys: 20 bytes and a control byte a slot at a load of 7/8 at most,
// bounded here by 128 bytes a key, room for the table to double under
// churn) and keys of at most MaxKeyBytes. TestMemoryStaysUnderBytes
// measures it.
func Bytes(capacity, nparts int) int {
	capacity, nparts = max(capacity, 1), max(nparts, 1)
	const slotBytes = 16 + 8 + 8 + 16 // key header, err, position; its heap entry (count, slot)
	const indexBytes = 128
	return 256 + capacity*(slotBytes+indexBytes+MaxKeyBytes+8*nparts)
}

// Add adds weight w (ignored unless positive) of key to part (taken modulo
// the sketch's parts). A key longer than MaxKeyBytes is refused: Add
// returns false and counts nothing.
func (s *Sketch) Add(key string, w int64, part int) bool {
	if len(key) > MaxKeyBytes {
		return false
	}
	if w <= 0 {
		return true
	}
	part %= s.nparts
	if part < 0 {
		part += s.nparts
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total += w
	if i, ok := s.index[key]; ok {
		pos := s.slots[i].pos
		s.heap[pos].count += w
		s.parts[int(i)*s.nparts+part] += w
		s.downLocked(pos)
		return true
	}
	if len(s.slots) < s.cap {
		i := int32(len(s.slots))
		key = strings.Clone(key) // not the caller's buffer, which may be larger
		s.slots = append(s.slots, slot{key: key, pos: len(s.heap)})
		s.heap = append(s.heap, heapEntry{count: w, slot: i})
		s.index[key] = i
		s.parts[int(i)*s.nparts+part] = w
		s.upLocked(len(s.heap) - 1)
		return true
	}
	// Full: the key takes the smallest counter (the heap's root), which
	// is at most total/cap since the counts sum to the total.
	root := &s.heap[0]
	i := root.slot
	sl := &s.slots[i]
	key = strings.Clone(key)
	delete(s.index, sl.key)
	sl.key, sl.err = key, root.count
	root.count += w
	p := s.parts[int(i)*s.nparts : int(i+1)*s.nparts]
	clear(p)
	p[part] = w
	s.index[key] = i
	s.downLocked(0)
	return true
}

// Total returns the sum of the weights added.
func (s *Sketch) Total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Len returns the keys held, at most Capacity.
func (s *Sketch) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.slots)
}

// Top returns at most n entries, highest Count first (ties by key), and
// the sketch's total weight.
func (s *Sketch) Top(n int) ([]Entry, int64) {
	s.mu.Lock()
	out := make([]Entry, len(s.slots))
	for i, sl := range s.slots {
		out[i] = Entry{Key: sl.key, Count: s.heap[sl.pos].count, Err: sl.err,
			Parts: slices.Clone(s.parts[i*s.nparts : (i+1)*s.nparts])}
	}
	total := s.total
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(max(n, 0), len(out))], total
}

// upLocked moves heap position i towards the root while it is smaller
// than its parent. REQUIRES: s.mu held.
func (s *Sketch) upLocked(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].count <= s.heap[i].count {
			return
		}
		s.swapLocked(i, p)
		i = p
	}
}

// downLocked moves heap position i away from the root while a child is
// smaller. REQUIRES: s.mu held.
func (s *Sketch) downLocked(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(s.heap) && s.heap[l].count < s.heap[small].count {
			small = l
		}
		if r := l + 1; r < len(s.heap) && s.heap[r].count < s.heap[small].count {
			small = r
		}
		if small == i {
			return
		}
		s.swapLocked(i, small)
		i = small
	}
}

// swapLocked swaps two heap positions (the slots stay where they are, and
// learn their new positions). REQUIRES: s.mu held.
func (s *Sketch) swapLocked(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.slots[s.heap[i].slot].pos = i
	s.slots[s.heap[j].slot].pos = j
}
