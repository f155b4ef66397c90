package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
)

// spent is what a measured phase took: wall time, the process's CPU time (all cores) and the
// bytes it wrote (the store's WAL, nearly all of it).
type spent struct {
	wall, cpu time.Duration
	written   int64
}

// measure runs f and returns what it spent.
func measure(f func() error) (spent, error) {
	start, cpu, written := time.Now(), processCPU(), processWritten()
	err := f()
	return spent{wall: time.Since(start), cpu: processCPU() - cpu, written: processWritten() - written}, err
}

// benchRaw commits n×m turns, written as the daemon writes them (rawTurns), to a fresh store
// from one goroutine, benchRawBatch turns per transaction, and returns what the commits spent.
func benchRaw(ctx context.Context, n, m int, texts []string) (spent, error) {
	turns := rawTurns(n, m, texts)
	var took spent
	err := withFreshStore(ctx, "raw", func(store *sqlite.Store) error {
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

// rawTurns returns the groups of n sessions' m turns each, turn k of every session before turn
// k+1, one group a turn. A turn writes what the daemon writes for it: the user message, the
// assistant reply, the user message's status, the session's activity, the reply's outbox entry
// and its delivery mark; a session's first turn also creates the session and its route, as the
// daemon's first message does (the daemon writes a route only when a session starts, so
// workload.Turn's route, which the persistence benchmarks keep as the reference's turn, is left
// out after the first). Keys and ids have the daemon's shapes: the bench platform's session
// keys and message ids, session ids of a start time and 8 hex digits, turn ids of 16. The timed
// raw phase therefore holds the same rows and updates as the daemon's load, in batches of the
// ideal size and with no actors.
func rawTurns(n, m int, texts []string) [][]persistence.Op {
	base := time.Now().UTC()
	r := rand.New(rand.NewPCG(3, 4))
	ss := make([]persistence.Session, n)
	for i := range n {
		src := benchSource(i)
		ss[i] = persistence.Session{
			ID: fmt.Sprintf("%s%08x", base.Format("20060102_150405_"), r.Uint32()), Key: identity.Key(src, identity.KeyOptions{}),
			Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID, UserID: src.UserID,
			Profile: src.Profile, StartedAt: base, LastActivityAt: base, Epoch: 1,
		}
	}
	turns := make([][]persistence.Op, 0, n*m)
	for k := range m {
		at := base.Add(time.Duration(k+1) * time.Millisecond)
		for i := range n {
			s := &ss[i]
			var ops []persistence.Op
			if k == 0 {
				ops = append(ops, &persistence.CreateSession{Session: *s},
					&persistence.PutRoute{Route: persistence.Route{Key: s.Key, SessionID: s.ID, Generation: 1, UpdatedAt: at}})
			}
			msgID, turnID := benchMessageID(i, k), fmt.Sprintf("t_%016x", r.Uint64())
			for _, op := range workload.TurnWith(*s, k, msgID, turnID, texts[2*(i*m+k)], texts[2*(i*m+k)+1], at) {
				if _, route := op.(*persistence.PutRoute); !route {
					ops = append(ops, op)
				}
			}
			// Delivered at its first try, as the daemon's marks say (MarkDelivery.Attempt): a
			// mark without the number is an older binary's, which the store counts otherwise.
			ops = append(ops, &persistence.MarkDelivery{SessionKey: s.Key, Seq: int64(k + 1), State: persistence.DeliveryDelivered, At: at,
				Attempt: 1})
			turns = append(turns, ops)
		}
	}
	return turns
}
