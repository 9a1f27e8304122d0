//go:build !race

package adaptive

import "time"

// longRun is the length of the long controller runs.
const longRun = time.Hour
