//go:build !linux

package main

// kernelFS is Linux's check only: elsewhere access(2) and the start say what they find.
func kernelFS(string) (string, bool) { return "", false }
