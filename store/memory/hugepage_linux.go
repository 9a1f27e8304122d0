package memory

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel to back the 2 MB-aligned interior of a large
// slot array with transparent huge pages (where THP is in "madvise" mode).
// A table of millions of keys spans hundreds of MB; with 4 KB pages nearly
// every lookup also misses the TLB, which costs one more memory access.
// It is advice only: errors are ignored.
func adviseHuge(p unsafe.Pointer, size uintptr) {
	const huge = 2 << 20
	if size < 2*huge {
		return
	}
	start := (uintptr(p) + huge - 1) &^ (huge - 1)
	end := (uintptr(p) + size) &^ (huge - 1)
	if end <= start {
		return
	}
	syscall.Madvise(unsafe.Slice((*byte)(unsafe.Add(p, start-uintptr(p))), end-start), 14) // MADV_HUGEPAGE
}
