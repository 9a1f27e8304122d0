package host

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/policy"
)

// A reload refused after its build (the OnBuild hook said no) leaves the
// old policy serving as it was. The build had already stopped the lease
// gate it was to replace (its lease handed over to the new gate, which
// never served and refreshed on, orphaned): the old chain spent no lease
// any more, and the orphan ran until the process ended.
func TestRefusedReloadLeavesTheOldLeaseRunning(t *testing.T) {
	src := func(onFailure string) string {
		return "version: 1\ngates:\n  - {name: api, kind: token_bucket, scope: service, rate: 1000/s, burst: 100, " +
			"lease: {time: 300ms, refresh: 50ms, on_failure: " + onFailure + "}}\n"
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(src("safe")), 0o644); err != nil {
		t.Fatal(err)
	}
	refuse := false
	h, err := New(Options{Config: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnBuild: func(*policy.Runtime) error {
			if refuse {
				return errors.New("the caller refuses this policy")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	state := func() lease.GateState {
		g, _ := sluice.As[*lease.Gate](h.Chain().Gates()[0])
		return g.ReportState(h.Chain().Clock().Now()).(lease.GateState)
	}
	poll.Until(t, 5*time.Second, func() bool { st := state(); return st.Live && !st.Learning })
	refuse = true
	if err := os.WriteFile(path, []byte(src("closed")), 0o644); err != nil { // the same budget, rebuilt
		t.Fatal(err)
	}
	if changed, err := h.Reload(); changed || err == nil {
		t.Fatalf("reload: changed %v, %v; want refused", changed, err)
	}
	time.Sleep(400 * time.Millisecond)                                // past the lease time: only a refreshed lease is live
	poll.Until(t, 5*time.Second, func() bool { return state().Live }) // a busy machine may let it lapse for a moment

}
