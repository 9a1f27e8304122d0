//go:build !unix

package shed

import "time"

// processCPU is not available here: the CPU source reads 0.
func processCPU() time.Duration { return 0 }
