package postgres

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestUnansweredCommitOfABatchIsSettled: the persistence actor's batch, committed on
// PostgreSQL, whose COMMIT's answer does not come within the store's Timeout (a relay holds
// it, the server having committed) is settled on the server's record of the transaction,
// asked on a fresh connection: it committed, so the write is acknowledged as stored and not
// spooled, and its counters (a crash attempt, a delivery attempt) count once. One whose COMMIT
// never reached the server (the relay drops it; the server aborts the transaction once pgx
// closes the connection at the timeout) wrote nothing: it is spooled and replayed, and counts
// once too. Before, a COMMIT unanswered in time failed at once with ErrUnavailable: the actor
// spooled the batch that had committed and replayed it, and the attempts counted twice.
func TestUnansweredCommitOfABatchIsSettled(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := newCommitRelay(t, dsn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Open(ctx, r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := mustConn(t, dsn)

	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	defer system.Shutdown()
	spoolFiles := make(chan int, 64) // the batches waiting in the spool, at each change
	pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, s, persistence.ActorOptions{
		MaxBatch: 64, Spool: sp, ReplayEvery: 10 * time.Millisecond, Log: quiet,
		SpoolFiles: func(n int) { spoolFiles <- n },
	})))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()

	for i, tc := range []struct {
		name    string
		mode    int32
		spooled bool   // the write went to the spool and was replayed
		asked   string // the server's last answer when asked for the transaction's fate
	}{
		{"committed", relayHoldAnswer, false, "committed"},
		{"never reached the server", relayMuteCommit, true, "aborted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sid, key := "s"+string(rune('a'+i)), "k"+string(rune('a'+i))
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(sid, key)},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 1, MessageID: "m-" + sid,
					Active: true, Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}},
				&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: key, Seq: 1, SessionID: sid,
					Kind: "reply", Text: "earlier", Platform: "http", ChatType: "dm", ChatID: "c-" + key, CreatedAt: t0}})
			// A turn's writes: its message's crash attempt, its answer, its usage, and a
			// delivery attempt of an earlier reply that did not go out.
			w := &persistence.Write{ID: uint64(i + 1), Ops: []persistence.Op{
				&persistence.IncrementAttempts{SessionID: sid, Seqs: []int64{1}},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 2, Active: true,
					Role: persistence.RoleAssistant, Content: "answer", CreatedAt: t0}},
				&persistence.AddUsage{SessionID: sid, TurnID: "t1", InputTokens: 10, OutputTokens: 5},
				&persistence.MarkDelivery{SessionKey: key, Seq: 1, State: persistence.DeliveryPending, At: t0},
			}}
			var res *persistence.WriteResult
			asked := r.armedFor(t, s, tc.mode, func() {
				v, err := system.Root.RequestFuture(pid, w, time.Minute).Result()
				if err != nil {
					t.Fatal(err)
				}
				res = v.(*persistence.WriteResult)
			})
			if res.Err != nil {
				t.Fatalf("the write = %v, want nil (stored or spooled)", res.Err)
			}
			// The actor spools a batch before it answers its writes, and says so first.
			spooled, waiting := false, 0
			for more := true; more; {
				select {
				case n := <-spoolFiles:
					spooled, waiting = spooled || n > 0, n
				default:
					more = false
				}
			}
			if len(asked) == 0 || asked[len(asked)-1] != tc.asked {
				t.Errorf("the server was asked for the transaction's fate and answered %q, want %q last", asked, tc.asked)
			}
			if spooled != tc.spooled {
				t.Errorf("the write was spooled: %v, want %v (the server was asked for its fate and answered %q)",
					spooled, tc.spooled, asked)
			}
			for waiting > 0 { // the replay drains the spool, and says so
				select {
				case waiting = <-spoolFiles:
				case <-time.After(30 * time.Second):
					t.Fatal("the spool was not replayed within 30 s")
				}
			}
			var msgAttempts, outboxAttempts, answers int
			var input, output int64
			if err := admin.QueryRow(ctx, `SELECT
					(SELECT attempts FROM messages WHERE session_id = $1 AND seq = 1),
					(SELECT attempts FROM outbox WHERE session_key = $2 AND seq = 1),
					(SELECT count(*) FROM messages WHERE session_id = $1 AND seq = 2),
					input_tokens, output_tokens FROM sessions WHERE id = $1`, sid, key).
				Scan(&msgAttempts, &outboxAttempts, &answers, &input, &output); err != nil {
				t.Fatal(err)
			}
			if msgAttempts != 1 || outboxAttempts != 1 {
				t.Errorf("attempts of the message = %d and of the reply's delivery = %d, want 1 and 1 (counted once)",
					msgAttempts, outboxAttempts)
			}
			if answers != 1 || input != 10 || output != 5 {
				t.Errorf("answers stored = %d, tokens = %d/%d, want 1 and 10/5", answers, input, output)
			}
		})
	}
}
