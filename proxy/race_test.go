//go:build race

package proxy

// raceEnabled: the race detector slows every goroutine several times over,
// so real-time shares measured under it say little about the code.
const raceEnabled = true
