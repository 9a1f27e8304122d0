//go:build race

package sim

// raceEnabled: the race detector slows the engine about tenfold, so the
// heaviest tests simulate shorter steps.
const raceEnabled = true
