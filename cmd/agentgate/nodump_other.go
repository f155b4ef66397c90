//go:build !linux

package main

// hideFromSameUser does nothing off Linux: there the daemon is not made undumpable, and a
// process of its user may still read its memory.
func hideFromSameUser() error { return nil }
