//go:build !linux

package demo

import "syscall"

// childAttr: elsewhere a child outlives a killed parent until stop.
func childAttr() *syscall.SysProcAttr { return nil }
