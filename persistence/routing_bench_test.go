package persistence_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
)

// BenchmarkRoutingKeys checks that a turn's routing update stays a B-tree update whatever the
// number of routing keys (issue #9: the per-turn routing cost at 11,000 keys is at most 1.25×
// its cost at 1,100 keys; perf-anchors §8 G6). Two fresh stores hold 1,100 and 11,000 sessions,
// each with its route; in both, the same 1,100 sessions are the active ones (they have one turn
// already, the others none), so the stores differ only in how many sessions and routes they
// know. Each round commits the same turns (the six ops of a turn, TouchSession and PutRoute among
// them) to active sessions drawn at random, alternating between the stores transaction by
// transaction so that both see the disk at the same moments; -v logs every round. It reports,
// per batch size (1 turn per transaction, and 100 as under load), the time per turn with both
// key counts and their ratio (median over rounds).
func BenchmarkRoutingKeys(b *testing.B) {
	const small, large = 1100, 11000 // known keys; the first small of them are active
	for _, tc := range []struct{ perTxn, turns int }{{1, 600}, {100, 3000}} {
		b.Run(fmt.Sprintf("turns_per_txn=%d", tc.perTxn), func(b *testing.B) {
			stores := [2]*keyStore{mustKeyStore(b, small, small), mustKeyStore(b, large, small)}
			var smallUS, largeUS, ratio []float64
			round := 0
			for b.Loop() {
				var took [2]time.Duration
				for i := 0; i < tc.turns; i += tc.perTxn {
					first := (i/tc.perTxn + round) % 2 // alternate which store goes first
					for _, k := range []int{first, 1 - first} {
						took[k] += stores[k].commitTurns(b, tc.perTxn)
					}
				}
				round++
				s := float64(took[0].Microseconds()) / float64(tc.turns)
				l := float64(took[1].Microseconds()) / float64(tc.turns)
				smallUS, largeUS, ratio = append(smallUS, s), append(largeUS, l), append(ratio, l/s)
				if testing.Verbose() {
					b.Logf("round %d: %d keys %.1f µs/turn, %d keys %.1f µs/turn, ratio %.3f", round, small, s, large, l, l/s)
				}
			}
			b.ReportMetric(workload.Median(smallUS), fmt.Sprintf("us/turn@%d", small))
			b.ReportMetric(workload.Median(largeUS), fmt.Sprintf("us/turn@%d", large))
			b.ReportMetric(workload.Median(ratio), "ratio")
			b.Log(workload.Target{Name: fmt.Sprintf("G6 per-turn cost at %d ÷ %d routing keys, %d turns per transaction", large, small, tc.perTxn),
				Bound: 1.25, AtMost: true}.Verdict(workload.Median(ratio)))
		})
	}
}

// keyStore is a store seeded with known sessions and routes, and the state to write further
// turns to random active ones.
type keyStore struct {
	store    *sqlite.Store
	sessions []persistence.Session
	active   int   // sessions[:active] get the turns
	next     []int // next turn number of each session
	texts    []string
	rng      *rand.Rand
}

// mustKeyStore opens a fresh store in b.TempDir() with known sessions, each with its route, the
// first active of them with one turn, so that each measured PutRoute updates an existing route.
func mustKeyStore(b *testing.B, known, active int) *keyStore {
	b.Helper()
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "keys.db"), sqlite.Options{})
	if err != nil {
		b.Fatalf("open store: %v", err)
	}
	b.Cleanup(func() {
		if err := store.Close(); err != nil {
			b.Errorf("close store: %v", err)
		}
	})
	ks := &keyStore{store: store, active: active, next: make([]int, known), rng: rand.New(rand.NewPCG(3, 4)),
		texts: workload.Texts(rand.New(rand.NewPCG(1, 2)), 1000)}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var groups [][]persistence.Op
	flush := func() {
		for i, err := range store.Commit(ctx, groups) {
			if err != nil {
				b.Fatalf("seed group %d: %v", i, err)
			}
		}
		groups = groups[:0]
	}
	for i := range known {
		ss := persistence.Session{
			ID: fmt.Sprintf("sess-%05d", i), Key: fmt.Sprintf("agent:main:bench:dm:chat-%05d", i),
			Platform: "bench", ChatType: "dm", ChatID: fmt.Sprintf("chat-%05d", i), UserID: "u",
			Profile: "default", StartedAt: base, LastActivityAt: base, Epoch: 1,
		}
		ks.sessions = append(ks.sessions, ss)
		groups = append(groups, []persistence.Op{&persistence.CreateSession{Session: ss},
			&persistence.PutRoute{Route: persistence.Route{Key: ss.Key, SessionID: ss.ID, Generation: 1, UpdatedAt: base}}})
		if i < active {
			groups = append(groups, ks.turn(i, base))
		}
		if len(groups) >= 1000 {
			flush()
		}
	}
	flush()
	runtime.GC()
	return ks
}

// turn returns the ops of session i's next turn.
func (ks *keyStore) turn(i int, at time.Time) []persistence.Op {
	k := ks.next[i]
	ks.next[i]++
	return workload.Turn(ks.sessions[i], k, ks.texts[(2*k)%len(ks.texts)], ks.texts[(2*k+1)%len(ks.texts)], at)
}

// commitTurns commits one transaction of n turns of distinct random active sessions and returns
// how long the Commit took.
func (ks *keyStore) commitTurns(b *testing.B, n int) time.Duration {
	at := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	groups := make([][]persistence.Op, 0, n)
	seen := make(map[int]bool, n)
	for len(groups) < n {
		i := ks.rng.IntN(ks.active)
		if seen[i] {
			continue
		}
		seen[i] = true
		groups = append(groups, ks.turn(i, at))
	}
	start := time.Now()
	errs := ks.store.Commit(context.Background(), groups)
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			b.Fatalf("commit group %d: %v", i, err)
		}
	}
	return took
}
