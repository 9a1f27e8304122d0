package demo

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// A load step on the demo upstream over real HTTP with open-loop load: the
// ladder goes NORMAL → DEGRADE → SHED → RECOVER → NORMAL without
// oscillating, and critical traffic keeps ≥ 95% of its offered rate useful.
func TestLadderLoadStep(t *testing.T) {
	if testing.Short() {
		t.Skip("real load for about 20 s")
	}
	rep, err := RunLadderStep(context.Background(), []LadderPhase{
		{For: 2 * time.Second, Share: 0.2},
		{For: 3 * time.Second, Share: 0.65}, // with critical's 25%: ~0.9 → DEGRADE
		{For: 5 * time.Second, Share: 3},    // → SHED
		{For: 8 * time.Second, Share: 0.2},  // → RECOVER → NORMAL
	})
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(os.Stdout)
	seen := map[sluice.Level]bool{}
	shedEntries := 0
	for _, tr := range rep.Transitions {
		seen[tr.To] = true
		if tr.To == sluice.LevelShed {
			shedEntries++
		}
	}
	for _, lv := range []sluice.Level{sluice.LevelDegrade, sluice.LevelShed, sluice.LevelRecover, sluice.LevelNormal} {
		if !seen[lv] {
			t.Errorf("the ladder never entered %s", lv)
		}
	}
	if shedEntries != 1 || len(rep.Transitions) > 6 {
		t.Errorf("oscillation: %d transitions, SHED entered %d times", len(rep.Transitions), shedEntries)
	}
	if last := rep.Rows[len(rep.Rows)-1].Level; last != sluice.LevelNormal {
		t.Errorf("ended in %s, not normal", last)
	}
	if ok := float64(rep.CriticalUseful) / float64(rep.CriticalOffered); ok < 0.95 {
		t.Errorf("critical goodput %.1f%% of offered, want ≥ 95%%", 100*ok)
	}
}
