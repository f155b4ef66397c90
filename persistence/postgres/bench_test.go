package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/persistence/workload"
)

// BenchmarkCommitTurns commits turns (persistence/workload: six ops, two 300-byte messages) of
// 100 sessions, batch turns per Commit, on PostgreSQL, next to the same turns on SQLite
// (synchronous FULL) in the same run: one b.Loop iteration commits one batch to each. Under
// -bench the test server is durable (fsync, synchronous_commit on). It reports pg_turns/s,
// sqlite_turns/s and their ratio; the server's own CPU is not in this process's figures.
func BenchmarkCommitTurns(b *testing.B) {
	const sessions = 100
	texts := workload.Texts(rand.New(rand.NewPCG(1, 2)), 4096)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, batch := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			pg, _ := MustOpen(b)
			lite, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "agentgate.db"), sqlite.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer lite.Close()
			stores := []persistence.Store{pg, lite}
			ss := make([]persistence.Session, sessions)
			var setup []persistence.Op
			for i := range ss {
				ss[i] = newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))
				setup = append(setup, &persistence.CreateSession{Session: ss[i]})
			}
			for _, s := range stores {
				storetest.MustCommit(b, s, setup...)
			}
			groups := make([][]persistence.Op, batch)
			var spent [2]time.Duration
			n := 0 // turns committed to each store
			for b.Loop() {
				for i := range groups {
					groups[i] = benchTurn(ss, n, texts, base)
					n++
				}
				for j, s := range stores {
					spent[j] += timedCommit(b, s, groups)
				}
			}
			pgRate, liteRate := float64(n)/spent[0].Seconds(), float64(n)/spent[1].Seconds()
			b.ReportMetric(pgRate, "pg_turns/s")
			b.ReportMetric(liteRate, "sqlite_turns/s")
			b.ReportMetric(pgRate/liteRate, "pg/sqlite")
		})
	}
}

// BenchmarkFencedCommit measures what ownership fencing (cluster mode) costs a commit on
// PostgreSQL: the same turns, batch per Commit, once with a Fence first in every group (the
// owner row read FOR SHARE) and once without, alternating batch by batch on two sets of 100
// sessions of one database. It reports both rates and fenced/plain.
func BenchmarkFencedCommit(b *testing.B) {
	const sessions = 100
	texts := workload.Texts(rand.New(rand.NewPCG(3, 4)), 4096)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			pg, _ := MustOpen(b)
			ctx := context.Background()
			type side struct {
				ss     []persistence.Session
				epochs []int64 // nil: no fence
				spent  time.Duration
			}
			sides := []*side{{}, {epochs: make([]int64, sessions)}}
			for k, sd := range sides {
				var setup []persistence.Op
				for i := range sessions {
					s := newSession(fmt.Sprintf("s%d-%d", k, i), fmt.Sprintf("k%d-%d", k, i))
					sd.ss = append(sd.ss, s)
					setup = append(setup, &persistence.CreateSession{Session: s})
					if sd.epochs != nil {
						e, err := pg.Claim(ctx, s.Key, "bench", base, nil)
						if err != nil {
							b.Fatal(err)
						}
						sd.epochs[i] = e.Epoch
					}
				}
				storetest.MustCommit(b, pg, setup...)
			}
			groups := make([][]persistence.Op, batch)
			n := 0 // turns committed to each side
			for b.Loop() {
				for _, sd := range sides {
					for i := range groups {
						groups[i] = benchTurn(sd.ss, n+i, texts, base)
						if j := (n + i) % sessions; sd.epochs != nil {
							groups[i] = append([]persistence.Op{&persistence.Fence{Key: sd.ss[j].Key, Epoch: sd.epochs[j]}}, groups[i]...)
						}
					}
					sd.spent += timedCommit(b, pg, groups)
				}
				n += batch
			}
			plain, fenced := float64(n)/sides[0].spent.Seconds(), float64(n)/sides[1].spent.Seconds()
			b.ReportMetric(plain, "plain_turns/s")
			b.ReportMetric(fenced, "fenced_turns/s")
			b.ReportMetric(fenced/plain, "fenced/plain")
		})
	}
}

// BenchmarkExclusiveCommit measures what the daemon fence of an exclusive store (the lock's
// epoch checked at the start of every write transaction, migration 0006) costs a commit: the
// same turns, batch per Commit, alternating batch by batch between an exclusive store and a
// shared one, each on a database of its own on the same server. It reports both rates and
// exclusive/shared.
func BenchmarkExclusiveCommit(b *testing.B) {
	const sessions = 100
	texts := workload.Texts(rand.New(rand.NewPCG(5, 6)), 4096)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			type side struct {
				st    *Store
				ss    []persistence.Session
				spent time.Duration
			}
			var sides []*side
			for _, exclusive := range []bool{false, true} {
				st, err := Open(ctx, pgtest.NewDatabase(b), Options{Exclusive: exclusive})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { st.Close() })
				sd := &side{st: st}
				var setup []persistence.Op
				for i := range sessions {
					s := newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))
					sd.ss = append(sd.ss, s)
					setup = append(setup, &persistence.CreateSession{Session: s})
				}
				storetest.MustCommit(b, st, setup...)
				sides = append(sides, sd)
			}
			groups := make([][]persistence.Op, batch)
			n := 0 // turns committed to each side
			for b.Loop() {
				for _, sd := range sides {
					for i := range groups {
						groups[i] = benchTurn(sd.ss, n+i, texts, base)
					}
					sd.spent += timedCommit(b, sd.st, groups)
				}
				n += batch
			}
			shared, exclusive := float64(n)/sides[0].spent.Seconds(), float64(n)/sides[1].spent.Seconds()
			b.ReportMetric(shared, "shared_turns/s")
			b.ReportMetric(exclusive, "exclusive_turns/s")
			b.ReportMetric(exclusive/shared, "exclusive/shared")
		})
	}
}

// benchTurn is turn n of the benchmarks' workload: the sessions take turns, each turn's texts
// come from texts in order, and each turn is a millisecond after the one before.
func benchTurn(ss []persistence.Session, n int, texts []string, base time.Time) []persistence.Op {
	return workload.Turn(ss[n%len(ss)], n/len(ss), texts[(2*n)%len(texts)], texts[(2*n+1)%len(texts)],
		base.Add(time.Duration(n)*time.Millisecond))
}

// timedCommit commits groups to st, failing b on any group's error, and returns how long the
// Commit took.
func timedCommit(b *testing.B, st persistence.Store, groups [][]persistence.Op) time.Duration {
	start := time.Now()
	errs := st.Commit(context.Background(), groups)
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			b.Fatalf("Commit group %d: %v", i, err)
		}
	}
	return took
}
