//go:build !linux

package main

import "time"

// newPacer returns time.Sleep's pacing where nanosleep's is not built (see
// pace_linux.go).
func newPacer() (sleepUntil func(time.Time)) {
	return func(at time.Time) { time.Sleep(time.Until(at)) }
}
