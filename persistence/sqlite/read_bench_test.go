package sqlite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/workload"
)

// BenchmarkLoadSession loads the snapshot a session actor reads when it activates (route,
// session row, pending messages, the last 20 messages, undelivered replies and the highest seqs)
// for 100 sessions of 30 turns each, all replies but the last delivered, one key after the other: one b.Loop iteration is one
// LoadSession. It runs under a cancellable context, as the daemon's does.
func BenchmarkLoadSession(b *testing.B) {
	const sessions, turns, history = 100, 30, 20
	const pendingLimit = 51 // sessions.queue.cap + 1, as a session reads at its default cap
	s := MustOpen(b, Options{})
	texts := workload.Texts(rand.New(rand.NewPCG(1, 2)), 2*sessions*turns)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ss := make([]persistence.Session, sessions)
	var groups [][]persistence.Op
	for i := range ss {
		ss[i] = newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))
		groups = append(groups, []persistence.Op{&persistence.CreateSession{Session: ss[i]}})
	}
	for k := range turns {
		for i := range ss {
			n := k*sessions + i
			at := base.Add(time.Duration(n) * time.Millisecond)
			groups = append(groups, workload.Turn(ss[i], k, texts[2*n], texts[2*n+1], at))
			if k < turns-1 { // the last reply is still to be delivered
				groups = append(groups, []persistence.Op{&persistence.MarkDelivery{SessionKey: ss[i].Key,
					Seq: int64(k + 1), State: persistence.DeliveryDelivered, At: at, Attempt: 1}})
			}
		}
	}
	for i, err := range s.Commit(context.Background(), groups) {
		if err != nil {
			b.Fatalf("Commit group %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	for b.Loop() {
		snap, err := s.LoadSession(ctx, ss[n%sessions].Key, history, pendingLimit)
		if err != nil {
			b.Fatal(err)
		}
		if snap.Session == nil || len(snap.History) != history || snap.LastSeq != 2*turns || len(snap.Unconfirmed) != 1 {
			b.Fatalf("snapshot of %s: session %v, %d history rows, last seq %d, %d unconfirmed", ss[n%sessions].Key,
				snap.Session != nil, len(snap.History), snap.LastSeq, len(snap.Unconfirmed))
		}
		n++
	}
}
