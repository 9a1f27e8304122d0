package sim

import (
	"testing"

	"github.com/sluice-go/sluice/cmd/internal/settle"
)

// The service-time step (5 ms → 25 ms for 30 s at three times the slow
// capacity) under the demo's own policy: goodput holds through the step,
// and the adaptive limit settles after it (Settle's measure).
func TestServiceStep(t *testing.T) {
	s := builtin(t, "service-step")
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "routes-api")})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Runs[1].Steps
	const up, down = 30, 60 // the rows where the service time changes
	slowCap := float64(s.Workers) / 0.025
	for _, r := range rows[up:down] {
		if r.Goodput < 0.85*slowCap {
			t.Errorf("t=%vs: goodput %.0f < 85%% of the slow capacity %.0f", r.T, r.Goodput, slowCap)
		}
	}
	for _, r := range rows {
		if (r.T < up || r.T >= down+1) && r.Goodput < 0.95*r.Offered {
			t.Errorf("t=%vs: goodput %.0f of %.0f offered outside the step", r.T, r.Goodput, r.Offered)
		}
	}
	// The limit's windows are the rows (1 s each): settled within 5 of them
	// after each change, and holding within its band after (no swing beyond
	// it where it binds).
	for _, ch := range []settle.Settling{Settle(rows, up, down), Settle(rows, down, len(rows))} {
		t.Logf("after row %d: settled at %d within %d windows, swing %d after", ch.From, ch.Final, ch.Windows, ch.Swing)
		if ch.Windows < 1 || ch.Windows > 5 || ch.Swing > 2*max(2, ch.Final/10) {
			t.Errorf("after row %d: %+v; want settled within 5 windows, swing within the band", ch.From, ch)
		}
	}
}
