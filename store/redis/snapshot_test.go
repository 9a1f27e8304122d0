package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// Redis restored from a snapshot taken while permits were held (their
// releases came after it) revives them: before, every take was refused
// until the permits' TTL (55 s of 95% 503s). Now a take that finds the
// limit full sees another Redis process vouched for the permits, drops
// them and admits: the gate is at its limit again within a second.
func TestRestoredSnapshotRevivesNoPermits(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, _ := limit.NewConcurrency(5)
	lim, err := bind(st)(concurrencySpec("snap", c, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var held []store.Handle
	for range 5 {
		r, h, err := lim.Take(ctx, "k", 0, 1, 0)
		if err != nil || !r.OK() {
			t.Fatalf("take: %v %v", r, err)
		}
		held = append(held, h)
	}
	if r, _, _ := lim.Take(ctx, "k", 0, 1, 0); r.OK() {
		t.Fatal("a sixth permit of 5")
	}
	srv.Do("SAVE") // the snapshot: 5 permits held
	for _, h := range held {
		if err := lim.Refund(ctx, "k", h, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart() // from the snapshot: the 5 permits are back, their releases lost
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, _, err := lim.Take(ctx, "k", 0, 1, 0)
		if err == nil && r.OK() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the restore the revived permits still refuse every take: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	admitted := 1
	for range 10 {
		if r, _, err := lim.Take(ctx, "k", 0, 1, 0); err == nil && r.OK() {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("after the restore %d admitted, want the limit's 5", admitted)
	}
}
