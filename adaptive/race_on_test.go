//go:build race

package adaptive

import "time"

// longRun is the length of the long controller runs: shorter under the
// race detector, which slows the model about fifteenfold.
const longRun = 10 * time.Minute
