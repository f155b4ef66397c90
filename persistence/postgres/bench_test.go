package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

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
			ctx := context.Background()
			groups := make([][]persistence.Op, batch)
			var spent [2]time.Duration
			n := 0 // turns committed to each store
			for b.Loop() {
				for i := range groups {
					groups[i] = workload.Turn(ss[n%sessions], n/sessions, texts[(2*n)%len(texts)],
						texts[(2*n+1)%len(texts)], base.Add(time.Duration(n)*time.Millisecond))
					n++
				}
				for j, s := range stores {
					start := time.Now()
					for i, err := range s.Commit(ctx, groups) {
						if err != nil {
							b.Fatalf("Commit group %d: %v", i, err)
						}
					}
					spent[j] += time.Since(start)
				}
			}
			pgRate, liteRate := float64(n)/spent[0].Seconds(), float64(n)/spent[1].Seconds()
			b.ReportMetric(pgRate, "pg_turns/s")
			b.ReportMetric(liteRate, "sqlite_turns/s")
			b.ReportMetric(pgRate/liteRate, "pg/sqlite")
		})
	}
}
