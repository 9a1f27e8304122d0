//go:build race

package main

// raceEnabled: the race detector multiplies memory and time several times
// over; bounds stated for the real binary are not asserted under it.
const raceEnabled = true
