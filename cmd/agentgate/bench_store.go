package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
)

// spent is what a measured phase took: wall time and the process's CPU time (all cores).
type spent struct{ wall, cpu time.Duration }

// measure runs f and returns what it spent.
func measure(f func() error) (spent, error) {
	start, cpu := time.Now(), processCPU()
	err := f()
	return spent{wall: time.Since(start), cpu: processCPU() - cpu}, err
}

// benchRaw commits n×m turns (the ops of persistence/bench_test.go) to a fresh store from one
// goroutine, benchRawBatch turns per transaction, and returns what the commits spent.
func benchRaw(ctx context.Context, n, m int, texts []string) (spent, error) {
	sessions, turns := rawTurns(n, m, texts)
	var took spent
	err := withFreshStore(ctx, "raw", func(store *sqlite.Store) error {
		if err := commitAll(ctx, store, sessions); err != nil {
			return fmt.Errorf("create sessions: %w", err)
		}
		runtime.GC()
		var err error
		took, err = measure(func() error {
			for i := 0; i < len(turns); i += benchRawBatch {
				if err := commitAll(ctx, store, turns[i:min(i+benchRawBatch, len(turns))]); err != nil {
					return fmt.Errorf("turn %d: %w", i, err)
				}
			}
			return nil
		})
		return err
	})
	return took, err
}

// benchReplay commits the daemon's transactions again, in order, to a fresh store from one
// goroutine, and returns what the commits spent.
func benchReplay(ctx context.Context, txns [][][]persistence.Op) (spent, error) {
	var took spent
	err := withFreshStore(ctx, "replay", func(store *sqlite.Store) error {
		runtime.GC()
		var err error
		took, err = measure(func() error {
			for i, groups := range txns {
				if err := commitAll(ctx, store, groups); err != nil {
					return fmt.Errorf("transaction %d: %w", i, err)
				}
			}
			return nil
		})
		return err
	})
	return took, err
}

// withFreshStore runs f on a new store in a temporary directory that it removes afterwards.
func withFreshStore(ctx context.Context, name string, f func(*sqlite.Store) error) (err error) {
	dir, err := os.MkdirTemp("", "agentgate-bench-"+name+"-*")
	if err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	defer func() {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("bench %s: %w", name, rerr)
		}
	}()
	store, err := sqlite.Open(ctx, filepath.Join(dir, name+".db"), sqlite.Options{})
	if err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	defer func() {
		if cerr := store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("bench %s: close store: %w", name, cerr)
		}
	}()
	if err := f(store); err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	return nil
}

// recordingStore is the daemon's store as `agentgate bench` wraps it: while recording, it keeps
// the groups of every transaction the daemon commits, for benchReplay.
type recordingStore struct {
	persistence.Store

	mu        sync.Mutex
	recording bool
	txns      [][][]persistence.Op
}

// Commit implements persistence.Store.
func (r *recordingStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	r.mu.Lock()
	if r.recording {
		r.txns = append(r.txns, slices.Clone(groups))
	}
	r.mu.Unlock()
	return r.Store.Commit(ctx, groups)
}

// record starts or stops recording and returns what was recorded so far.
func (r *recordingStore) record(on bool) [][][]persistence.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recording = on
	return r.txns
}

func commitAll(ctx context.Context, store *sqlite.Store, groups [][]persistence.Op) error {
	return errors.Join(store.Commit(ctx, groups)...)
}

// rawTurns returns the groups creating n sessions and their n×m turns, turn k of every session
// before turn k+1, each a user message, an assistant message, a status change, a touch, a route
// and an outbox entry.
func rawTurns(n, m int, texts []string) (create, turns [][]persistence.Op) {
	base := time.Now().UTC()
	ss := make([]persistence.Session, n)
	for i := range n {
		ss[i] = persistence.Session{
			ID: fmt.Sprintf("sess-%d", i), Key: fmt.Sprintf("bench:dm:bench-%d", i),
			Platform: "bench", ChatType: "dm", ChatID: fmt.Sprintf("bench-%d", i), UserID: "u",
			Profile: "default", StartedAt: base, LastActivityAt: base, Epoch: 1,
		}
		create = append(create, []persistence.Op{&persistence.CreateSession{Session: ss[i]}})
	}
	for k := range m {
		for i := range n {
			at := base.Add(time.Duration(k+1) * time.Millisecond)
			turns = append(turns, workload.Turn(ss[i], k, texts[2*(i*m+k)], texts[2*(i*m+k)+1], at))
		}
	}
	return create, turns
}
