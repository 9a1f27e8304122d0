//go:build race

package memory_test

// raceEnabled: the race detector makes big loops several times slower.
const raceEnabled = true
