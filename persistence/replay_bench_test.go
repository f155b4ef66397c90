package persistence_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// outageBatches is the spool a long outage leaves: turns of 100 chats, each turn two batches of
// one write (its inbound message; its result), as a lightly loaded daemon spools them.
func outageBatches(turns int) [][][]persistence.Op {
	text := strings.Repeat("word ", 40)
	var out [][][]persistence.Op
	for i := range turns {
		sid, seq := fmt.Sprintf("s%d", i%100), int64(i/100)*2+1
		at := t0.Add(time.Duration(i) * time.Second)
		in := userMessage(sid, seq, fmt.Sprintf("m%d", i))
		in.Message.Content = text
		out = append(out, [][]persistence.Op{{in, &persistence.TouchSession{SessionID: sid, At: at}}})
		out = append(out, [][]persistence.Op{{
			&persistence.SetMessageStatus{SessionID: sid, Seqs: []int64{seq}, Status: persistence.StatusDone, TurnID: fmt.Sprintf("t%d", i)},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: seq + 1, Role: persistence.RoleAssistant,
				Content: text, TurnID: fmt.Sprintf("t%d", i), Active: true, CreatedAt: at}},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k" + sid, Seq: seq, SessionID: sid, Kind: "reply",
				Text: text, TurnID: fmt.Sprintf("t%d", i), Platform: "http", ChatType: "dm", ChatID: "c",
				State: persistence.DeliveryPending, CreatedAt: at}},
			&persistence.AddUsage{SessionID: sid, TurnID: fmt.Sprintf("t%d", i), InputTokens: 10, OutputTokens: 20},
		}})
	}
	return out
}

// countingStore counts the transactions a replay commits.
type countingStore struct {
	persistence.Store
	commits atomic.Int64
}

func (s *countingStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	s.commits.Add(1)
	return s.Store.Commit(ctx, groups)
}

// BenchmarkSpoolReplay replays the spool of a long outage (2,000 batches) into a fresh database
// (synchronous FULL, the default), as a start that finds it does. It reports the time of the
// replay, the transactions it committed and the -wal file's peak size.
func BenchmarkSpoolReplay(b *testing.B) {
	batches := outageBatches(1000)
	var took time.Duration
	var commits, peak int64
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var sessions [][]persistence.Op
		for i := range 100 {
			sessions = append(sessions, []persistence.Op{session(fmt.Sprintf("s%d", i), fmt.Sprintf("ks%d", i), t0)})
		}
		if errs := st.Commit(context.Background(), sessions); errs[0] != nil {
			b.Fatal(errs[0])
		}
		sp, err := spool.Open(filepath.Join(dir, "spool"))
		if err != nil {
			b.Fatal(err)
		}
		for _, groups := range batches {
			if _, err := sp.Append(groups); err != nil {
				b.Fatal(err)
			}
		}
		cs := &countingStore{Store: st}
		stop := make(chan struct{})
		watched := make(chan int64)
		go func() { // samples the -wal file's size while the replay runs
			var most int64
			for {
				if fi, err := os.Stat(st.Path() + "-wal"); err == nil {
					most = max(most, fi.Size())
				}
				select {
				case <-stop:
					watched <- most
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		quiet := slog.New(slog.DiscardHandler)
		system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		b.StartTimer()
		start := time.Now()
		pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(b.Context(), cs, persistence.ActorOptions{
			MaxBatch: benchMaxBatch, Spool: sp, ReplayEvery: time.Hour, Log: quiet})))
		// The actor replays when it starts, before it takes the Flush.
		if _, err := system.Root.RequestFuture(pid, &persistence.Flush{}, phaseTimeout).Result(); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		b.StopTimer()
		close(stop)
		peak = max(peak, <-watched)
		commits += cs.commits.Load()
		if sp.Len() != 0 {
			b.Fatalf("%d batches left in the spool after the replay", sp.Len())
		}
		_ = system.Root.StopFuture(pid).Wait()
		system.Shutdown()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/replay")
	b.ReportMetric(float64(commits)/float64(b.N), "tx/replay")
	b.ReportMetric(float64(peak)/(1<<20), "peak_wal_MB")
}
