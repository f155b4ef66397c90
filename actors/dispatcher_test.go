package actors

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// TestDispatcherReusesIdleWorkers: mailbox runs scheduled one after another run on one pool
// worker, not on a new goroutine each.
func TestDispatcherReusesIdleWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDispatcher(300, 4)
		defer d.Stop()
		var ran atomic.Int64
		for range 100 {
			d.Schedule(func() { ran.Add(1) })
			synctest.Wait() // the run is over and its worker idle again
		}
		if got := ran.Load(); got != 100 {
			t.Errorf("ran %d mailbox runs, want 100", got)
		}
		if got := d.workers.Load(); got != 1 {
			t.Errorf("pool workers = %d after 100 runs one at a time, want 1", got)
		}
	})
}

// TestDispatcherNeverWaitsForABusyWorker: while every pool worker is blocked, a mailbox still
// runs at once (on a goroutine of its own), and the pool never holds more than its bound.
func TestDispatcherNeverWaitsForABusyWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDispatcher(300, 1)
		defer d.Stop()
		max := d.max
		release := make(chan struct{})
		var blocked atomic.Int64
		for range max + 3 {
			d.Schedule(func() { blocked.Add(1); <-release })
		}
		synctest.Wait()
		if got := blocked.Load(); got != int64(max+3) {
			t.Fatalf("%d of %d blocking mailbox runs started, want all", got, max+3)
		}
		if got := d.workers.Load(); got != max {
			t.Errorf("pool workers = %d, want the bound %d", got, max)
		}
		ran := make(chan struct{})
		d.Schedule(func() { close(ran) })
		synctest.Wait()
		select {
		case <-ran:
		default:
			t.Fatal("a mailbox run waited for the blocked ones")
		}
		close(release)
		synctest.Wait()
		if got := d.workers.Load(); got != max {
			t.Errorf("pool workers after the blocked runs ended = %d, want %d (idle, kept)", got, max)
		}
	})
}

// TestDispatcherStop: Stop ends the idle workers; later mailbox runs still run.
func TestDispatcherStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDispatcher(300, 2)
		for range 3 {
			d.Schedule(func() {})
		}
		synctest.Wait()
		d.Stop()
		d.Stop() // idempotent
		synctest.Wait()
		if got := d.workers.Load(); got != 0 {
			t.Errorf("pool workers after Stop = %d, want 0", got)
		}
		var ran atomic.Bool
		d.Schedule(func() { ran.Store(true) })
		synctest.Wait()
		if !ran.Load() {
			t.Error("a mailbox run scheduled after Stop did not run")
		}
		if got := d.workers.Load(); got != 0 {
			t.Errorf("pool workers after a run past Stop = %d, want 0", got)
		}
	})
}
