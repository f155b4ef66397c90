//go:build !unix

package main

import "time"

// processCPU is not measured on this platform: the bench reports no CPU per turn.
func processCPU() time.Duration { return 0 }
