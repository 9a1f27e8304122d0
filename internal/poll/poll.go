// Package poll waits in tests for a condition that real I/O makes true
// (a server restarted, a probe answered), checking it every millisecond up
// to a generous bound: the bound only stops a broken test, it is never a
// timing claim, so a test that polls holds on a busy machine.
//
//	poll.Until(t, 10*time.Second, func() bool { return !st.Open() })
package poll

import (
	"testing"
	"time"
)

// Until returns once cond holds, and fails the test if it still does not
// after limit.
func Until(t testing.TB, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v", limit)
		}
		<-tick.C
	}
}
