package demo

import "syscall"

// childAttr makes a child process die with this one.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
