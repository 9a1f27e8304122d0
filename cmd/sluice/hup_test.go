//go:build unix

package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A storm of SIGHUPs (40 at 20/s, the policy changing before each) costs
// a reload a second at most: the signals that come during the gap after a
// reload make one reload after it. (Before, each signal reloaded, and at
// 10/s a lease fleet spent 1.46 times its budget.)
func TestSIGHUPStormIsCoalesced(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	pol := filepath.Join(t.TempDir(), "p.yaml")
	write := func(i int) {
		os.WriteFile(pol, []byte(fmt.Sprintf("version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: %d}\n", 10+i)), 0o644)
	}
	write(0)
	c := startChild(t, "proxy", "--config", pol, "--upstream", up.URL, "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "x")
	c.waitLine("sluice proxy serving")
	start := time.Now()
	for i := range 40 {
		write(i + 1)
		c.cmd.Process.Signal(syscall.SIGHUP)
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	time.Sleep(1500 * time.Millisecond) // the last coalesced reload
	reloads := strings.Count(c.logText(), "policy reloaded")
	// The signals: one at once, then one per gap while the storm lasts,
	// then the last; the file watcher (a check a second) adds as many.
	if limit := 2*int(took/time.Second) + 3; reloads > limit || reloads < 2 {
		t.Errorf("%d reloads in %v of 40 SIGHUPs, want 2 to %d (without the gap: one a signal)", reloads, took.Round(time.Millisecond), limit)
	}
	c.stop()
}
