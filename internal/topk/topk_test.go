package topk

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The paper's example shape: a full table, a newcomer takes the smallest
// counter and inherits its count as its error.
func TestEvictionInheritsTheSmallestCount(t *testing.T) {
	s := New(2, 1)
	s.Add("a", 5, 0)
	s.Add("b", 2, 0)
	s.Add("c", 1, 0) // replaces b (2): count 3, err 2
	got, total := s.Top(10)
	want := []Entry{{Key: "a", Count: 5, Parts: []int64{5}}, {Key: "c", Count: 3, Err: 2, Parts: []int64{1}}}
	if total != 8 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v total %d, want %v total 8", got, total, want)
	}
	s.Add("b", 4, 0) // replaces c (3): count 7, err 3; b ranks first now
	got, _ = s.Top(1)
	if fmt.Sprint(got) != fmt.Sprint([]Entry{{Key: "b", Count: 7, Err: 3, Parts: []int64{4}}}) {
		t.Fatalf("got %v", got)
	}
}

func TestPartsSplitTheWeightSinceEntry(t *testing.T) {
	s := New(4, 3)
	s.Add("a", 2, 0)
	s.Add("a", 3, 2)
	s.Add("a", 1, 5) // 5 mod 3 = 2
	s.Add("a", 1, -1)
	got, _ := s.Top(1)
	if fmt.Sprint(got[0].Parts) != "[2 0 5]" || got[0].Count != 7 {
		t.Fatalf("got %+v, want count 7 and parts [2 0 5] (5 and -1 are part 2)", got[0])
	}
}

func TestRefusesLongKeysAndIgnoresNonPositiveWeights(t *testing.T) {
	s := New(4, 1)
	if s.Add(strings.Repeat("k", MaxKeyBytes+1), 1, 0) {
		t.Fatal("a key over MaxKeyBytes was taken")
	}
	if !s.Add(strings.Repeat("k", MaxKeyBytes), 1, 0) {
		t.Fatal("a key of MaxKeyBytes was refused")
	}
	s.Add("z", 0, 0)
	s.Add("z", -5, 0)
	if s.Len() != 1 || s.Total() != 1 {
		t.Fatalf("len %d total %d, want 1 and 1", s.Len(), s.Total())
	}
	if got, _ := s.Top(-1); len(got) != 0 {
		t.Fatalf("Top(-1) = %v", got)
	}
}

// The guarantees of the package doc, against an exact count of the same
// stream.
func TestGuaranteesAgainstExactCounts(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 8).Draw(t, "capacity")
		s := New(capacity, 2)
		exact := map[string]int64{}
		last := map[string]int64{} // the Count a key had at its last reading
		var total int64
		for range rapid.IntRange(0, 200).Draw(t, "adds") {
			k := fmt.Sprint("k", rapid.IntRange(0, 20).Draw(t, "key"))
			w := rapid.Int64Range(1, 50).Draw(t, "w")
			s.Add(k, w, rapid.IntRange(0, 1).Draw(t, "part"))
			exact[k] += w
			total += w
			entries, tot := s.Top(capacity)
			if tot != total || len(entries) > capacity {
				t.Fatalf("total %d (want %d), %d entries for capacity %d", tot, total, len(entries), capacity)
			}
			held := map[string]bool{}
			var sum int64
			for _, e := range entries {
				held[e.Key] = true
				sum += e.Count
				if e.Count < exact[e.Key] || e.Count-e.Err > exact[e.Key] {
					t.Fatalf("%s: count %d err %d, exact %d", e.Key, e.Count, e.Err, exact[e.Key])
				}
				if e.Err*int64(capacity) > total {
					t.Fatalf("%s: err %d over total/capacity %d/%d", e.Key, e.Err, total, capacity)
				}
				if e.Parts[0]+e.Parts[1] != e.Count-e.Err {
					t.Fatalf("%s: parts %v do not sum to count-err %d", e.Key, e.Parts, e.Count-e.Err)
				}
				if e.Count < last[e.Key] {
					t.Fatalf("%s: count fell from %d to %d", e.Key, last[e.Key], e.Count)
				}
				last[e.Key] = e.Count
			}
			if sum != total && len(entries) == capacity {
				t.Fatalf("a full table's counts sum to %d, not the total %d", sum, total)
			}
			for k, n := range exact {
				if n*int64(capacity) > total && !held[k] {
					t.Fatalf("%s weighs %d > total/capacity %d/%d and is not held", k, n, total, capacity)
				}
			}
		}
	})
}

// A flood of distinct keys holds no more than Bytes: the heap live with
// the sketch, less the heap live once it is dropped.
func TestMemoryStaysUnderBytes(t *testing.T) {
	const capacity, nparts = 64, 8
	s := New(capacity, nparts)
	key := make([]byte, MaxKeyBytes)
	for i := range 200_000 {
		copy(key, fmt.Sprintf("%0*d", MaxKeyBytes, i))
		s.Add(string(key), int64(1+i%7), i)
	}
	if s.Len() != capacity {
		t.Fatalf("len %d, want %d", s.Len(), capacity)
	}
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(s)
	s = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	held := int64(with.HeapAlloc) - int64(without.HeapAlloc)
	if bound := int64(Bytes(capacity, nparts)); held > bound {
		t.Fatalf("the sketch holds %d bytes after 200,000 distinct keys, over Bytes = %d", held, bound)
	} else {
		t.Logf("held %d bytes of the %d bound", held, bound)
	}
}

func TestConcurrentAddsCountEveryWeight(t *testing.T) {
	s := New(16, 1)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				s.Add(fmt.Sprint("k", (g*1000+i)%40), 1, 0)
			}
		})
	}
	wg.Wait()
	if s.Total() != 4000 || s.Len() != 16 {
		t.Fatalf("total %d len %d", s.Total(), s.Len())
	}
}

func BenchmarkAddHeld(b *testing.B) {
	s := New(64, 8)
	s.Add("tenant-42", 1, 0)
	b.ReportAllocs()
	for b.Loop() {
		s.Add("tenant-42", 1, 3)
	}
}

func BenchmarkAddEvicting(b *testing.B) {
	s := New(64, 8)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprint("tenant-", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Add(keys[i%len(keys)], 1, 0)
		i++
	}
}
