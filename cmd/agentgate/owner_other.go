//go:build !unix

package main

import "io/fs"

// fileOwner is not known on this platform.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }
