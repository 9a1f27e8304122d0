//go:build !unix

package main

func setNoFile(string) {}
