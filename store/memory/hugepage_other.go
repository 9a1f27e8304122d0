//go:build !linux

package memory

import "unsafe"

func adviseHuge(p unsafe.Pointer, size uintptr) {}
