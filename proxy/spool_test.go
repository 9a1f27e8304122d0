package proxy

import (
	"errors"
	"io"
	"testing"
)

// The first free bytes of a spool are not charged to the budgets: with
// both budgets spent, a spool takes exactly free bytes and refuses the
// next one; with room, it charges only what lies past them, and gives back
// exactly what it charged.
func TestSpoolFreeBytesOutsideTheBudgets(t *testing.T) {
	spent := spoolLimits{memory: 64, free: 16, max: 1 << 20, memPool: newBudget(0), disk: newBudget(0)}
	sp := newSpool(spent)
	for i := range 16 {
		if _, err := sp.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("byte %d of 16 free ones: %v", i, err)
		}
	}
	if _, err := sp.Write([]byte{1}); !errors.Is(err, errSpoolFull) {
		t.Fatalf("the 17th byte with the budgets spent: %v, want errSpoolFull", err)
	}
	if b, _ := io.ReadAll(sp); len(b) != 16 || b[15] != 15 {
		t.Fatalf("read back %v", b)
	}
	sp.Close()

	pool := newBudget(100)
	lim := spoolLimits{memory: 64, free: 16, max: 1 << 20, memPool: pool, disk: newBudget(0)}
	sp = newSpool(lim)
	sp.Write(make([]byte, 10)) // free
	sp.Write(make([]byte, 10)) // 4 charged
	sp.Write(make([]byte, 30)) // 30 charged
	if left := pool.left.Load(); left != 66 {
		t.Fatalf("50 bytes with 16 free: %d of 100 left, want 66", left)
	}
	sp.Close()
	if left := pool.left.Load(); left != 100 {
		t.Fatalf("after Close: %d of 100 left", left)
	}
}
