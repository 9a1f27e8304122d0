package host

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/logbuf"
)

// The tracker lists exactly the requests still in flight, whatever order
// they end in and whichever shard they went to, and a second Untrack
// changes nothing.
func TestTrackerListsWhatIsInFlight(t *testing.T) {
	tr := NewTracker()
	es := make([]*Tracked, 40)
	for i := range es {
		es[i] = tr.Track("GET", fmt.Sprintf("/r/%d", i))
	}
	for i := 0; i < len(es); i += 3 {
		tr.Untrack(es[i])
		tr.Untrack(es[i]) // once more: a no-op
	}
	want := 0
	for i := range es {
		if i%3 != 0 {
			want++
		}
	}
	if got := tr.Len(); got != want {
		t.Fatalf("Len %d, want %d", got, want)
	}
	var buf logbuf.Buffer
	if n := tr.logCut(slog.New(slog.NewTextHandler(&buf, nil)), "proxy", time.Second); n != want {
		t.Fatalf("logCut counted %d, want %d", n, want)
	}
	out := buf.String()
	for i := range es {
		has := strings.Contains(out, fmt.Sprintf("path=/r/%d ", i))
		if has != (i%3 != 0) {
			t.Errorf("/r/%d listed %v, in flight %v", i, has, i%3 != 0)
		}
	}
}

// Wait returns once the last request ends, also when requests start and
// end on many goroutines around it, and at once when none is in flight.
func TestTrackerWaitSeesTheLastEnd(t *testing.T) {
	tr := NewTracker()
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 200; round++ {
		hold := tr.Track("GET", "/hold")
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					tr.Untrack(tr.Track("POST", "/x"))
				}
			}()
		}
		done := make(chan error, 1)
		go func() { done <- tr.Wait(context.Background()) }()
		wg.Wait()
		tr.Untrack(hold)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := tr.Len(); n != 0 {
			t.Fatalf("round %d: Len %d after every request ended", round, n)
		}
	}
	// A Wait that gives up leaves the tracker as it was.
	e := tr.Track("GET", "/slow")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tr.Wait(ctx); err == nil {
		t.Fatal("Wait returned nil with a request in flight and its context done")
	}
	tr.Untrack(e)
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// With a request in flight the whole time (each new one tracked before
// the one before it is untracked, in shards that differ), Len never reads
// 0: the shards are counted at one instant.
func TestTrackerNeverReadsIdleWithARequestInFlight(t *testing.T) {
	tr := NewTracker()
	swapped, release := make(chan struct{}), make(chan struct{})
	var wg, ended sync.WaitGroup
	for range 2 {
		wg.Add(1)
		ended.Add(1)
		old := tr.Track("GET", "/a") // before Len is first read
		go func() {
			defer ended.Done()
			for range 200_000 {
				e := tr.Track("GET", "/b")
				tr.Untrack(old)
				old = e
			}
			wg.Done()
			<-release // the last stays in flight until every read is done
			tr.Untrack(old)
		}()
	}
	go func() { wg.Wait(); close(swapped) }()
	reads := 0
	for more := true; more; reads++ {
		select {
		case <-swapped:
			more = false
		default:
		}
		if n := tr.Len(); n == 0 {
			close(release)
			ended.Wait()
			t.Fatalf("Len read 0 after %d reads with requests in flight", reads)
		}
	}
	close(release)
	ended.Wait()
	if err := tr.Wait(context.Background()); err != nil || tr.Len() != 0 {
		t.Fatalf("after every request ended: Wait %v, Len %d", err, tr.Len())
	}
}
