package rlsserve

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A named pipe among the configuration files is skipped, as rls.Load
// skips it: the watcher read it, blocking until something wrote to it, and
// Run waited for the watcher before draining, so SIGTERM never stopped the
// server (its health checks kept answering OK).
func TestNamedPipeInConfigFolder(t *testing.T) {
	dir := edgeDir(t)
	r := start(t, Options{Config: dir, Clock: newClock(now)})
	pipe := filepath.Join(dir, "pipe.yaml")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Skip("no named pipes:", err)
	}
	unblock := func() { // lets a blocked reader go, and removes the pipe
		for range 500 {
			if f, err := os.OpenFile(pipe, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				os.Remove(pipe)
				f.Close()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		os.Remove(pipe)
	}
	ticked := make(chan struct{})
	go func() {
		r.tick()
		r.tick()
		r.tick()
		close(ticked)
	}()
	select {
	case <-ticked:
	case <-time.After(5 * time.Second):
		unblock()
		<-ticked
		t.Error("the configuration watcher blocked reading a named pipe")
	}
	if v, err := Fingerprint(dir); err != nil || v != r.Version() {
		t.Errorf("Fingerprint with the pipe: %v %v, want the version serving %v", v, err, r.Version())
	}
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		unblock()
		<-r.done
		t.Error("Run did not return")
	}
	r.stopped = true
	r.conn.Close()
}
