package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	s, err := Open(ctx, r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour, Timeout: 3 * time.Second})
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

// holdCommits makes every COMMIT of a transaction of the database dsn that counted an attempt
// of a message wait, inside the server, while holder holds an advisory lock (hold; release
// lets them commit): a deferred constraint trigger, run at COMMIT, takes the lock. The
// transaction stays 'in progress' meanwhile, holding its row locks, as one does whose COMMIT
// waits for its WAL to reach the disk.
func holdCommits(t *testing.T, dsn string) (hold, release func()) {
	t.Helper()
	ctx := context.Background()
	admin, holder := mustConn(t, dsn), mustConn(t, dsn)
	if _, err := admin.Exec(ctx, `
		CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS
			'BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END';
		CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON messages DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.attempts > OLD.attempts) EXECUTE FUNCTION hold_commit()`); err != nil {
		t.Fatal(err)
	}
	lock := func(sql string) func() {
		return func() {
			var ok bool
			if err := holder.QueryRow(ctx, sql).Scan(&ok); err != nil || !ok {
				t.Errorf("%s = %v, %v", sql, ok, err)
			}
		}
	}
	return lock(`SELECT true FROM pg_advisory_lock(4242)`), lock(`SELECT pg_advisory_unlock(4242)`)
}

// noCancelRelay returns the dsn of a relay to the database dsn that passes on no cancel
// request, as none ends a COMMIT that flushes its WAL (a critical section): pgx sends one as
// it closes a connection whose context ended, and it would end a wait holdCommits makes.
func noCancelRelay(t *testing.T, dsn string) string {
	t.Helper()
	relayed, _ := relayConns(t, dsn, "pgnocancel", func(c, up net.Conn) func(dst, src net.Conn, fromClient bool) {
		return func(dst, src net.Conn, fromClient bool) {
			buf := make([]byte, 32<<10)
			for first := true; ; first = false {
				n, err := src.Read(buf)
				// A CancelRequest: its length, 16, and its code, 80877102.
				if first && fromClient && n == 16 && binary.BigEndian.Uint32(buf[4:8]) == 80877102 {
					_, _ = c.Close(), up.Close()
					return
				}
				if n > 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					_ = dst.Close()
					return
				}
			}
		}
	})
	return relayed
}

// TestUnansweredCommitStillInProgressIsAwaited: a COMMIT that goes unanswered within the call's
// Timeout because the server is still committing it (here a deferred trigger waits for an
// advisory lock; in production, a disk slow to sync the WAL) leaves its transaction 'in
// progress', holding its row locks, for as long as that lasts. Its fate is asked for until the
// server has one, within the Timeout of its own: the transaction commits once the lock is let
// go (after xactAsks answers 'in progress'), and the call succeeds, for a batch of the
// persistence actor (Commit: its attempt counted once) as for BeginRun (the unclean stop it
// counts is the last run's). Before, the store gave up after xactAsks asks (0.31 s) and failed
// the call as unavailable: the actor spooled the batch, whose replay waited for the row locks
// and counted the attempt again once the first committed; BeginRun's caller ran it again,
// which counted an unclean stop of its own run.
func TestUnansweredCommitStillInProgressIsAwaited(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	// The fate is asked for within 2 s: the xactAsks asks, and the one after the lock is let go.
	s, err := Open(ctx, noCancelRelay(t, dsn), Options{Exclusive: true, LockCheckInterval: time.Hour, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := mustConn(t, dsn)
	for _, id := range []string{"s0", "s1"} {
		storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(id, "k"+id)},
			&persistence.PutRoute{Route: persistence.Route{Key: "k" + id, SessionID: id, Generation: 1, UpdatedAt: t0}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 1, MessageID: "m" + id, Active: true,
				Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	}
	// The message of s0 is counted by the batch (it has a crash attempt since: the unclean stop
	// leaves it), that of s1 by the unclean stop of r1, a run that dies: the next start counts it.
	storetest.MustCommit(t, s, &persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}})
	if _, err := s.BeginRun(ctx, "r1", t0); err != nil {
		t.Fatal(err)
	}
	hold, release := holdCommits(t, dsn)

	var stop *persistence.UncleanStop
	for _, tc := range []struct {
		name    string
		call    func() error // run again, as its caller would, when it fails as unavailable
		session string       // whose message s/1 the call counts an attempt of
	}{
		{"commit", func() error {
			return s.Commit(ctx, [][]persistence.Op{{&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}})[0]
		}, "s0"},
		{"begin run", func() (err error) { stop, err = s.BeginRun(ctx, "r2", t0.Add(time.Minute)); return err }, "s1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mustAttempts(t, admin, tc.session, 1)
			var mu sync.Mutex
			var asked []string
			s.asked = func(status string) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, status)
				if status == "in progress" && len(asked) == xactAsks {
					release() // the server commits it now
				}
			}
			defer func() { s.asked = nil }()
			hold()
			err := tc.call()
			mu.Lock()
			got := slices.Clone(asked)
			mu.Unlock()
			if len(got) < xactAsks {
				release()
				t.Fatalf("the server was asked for the transaction's fate %d times (%q), want %d at least: the test does not test",
					len(got), got, xactAsks)
			}
			if err != nil {
				t.Errorf("the call = %v, want nil (the server committed it; asked: %q)", err, got)
				if !errors.Is(err, persistence.ErrUnavailable) {
					t.Fatal("not unavailable: it would not be run again")
				}
				if err := tc.call(); err != nil { // the spool's replay, the start's next try
					t.Fatal(err)
				}
			}
			if n := mustAttempts(t, admin, tc.session, 1); n != before+1 {
				t.Errorf("attempts of %s/1 = %d, want %d (counted once)", tc.session, n, before+1)
			}
		})
	}
	if stop == nil || stop.Run != "r1" {
		t.Errorf("BeginRun counted the unclean stop of %+v, want r1's (not its own run's)", stop)
	}
}

// TestUnansweredCommitKeepsItsGroupsRefusals: a batch whose COMMIT's answer does not come within
// the store's Timeout (a relay holds it) and that the server committed is settled as if the
// answer had come for its refused groups too: one the savepoint pass refused for what it holds
// keeps ErrConflict, and one invalid on its face its own error, while the others succeed.
// Before, the call's bound having run out, each was told that the database did not answer
// (ErrUnavailable, its own error dropped): the persistence actor spooled it and told its sender
// it was stored, and its replay, refused again, set it aside.
func TestUnansweredCommitKeepsItsGroupsRefusals(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := newCommitRelay(t, dsn)
	ctx := context.Background()
	s, err := Open(ctx, r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := mustConn(t, dsn)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	var errs []error
	asked := r.armedFor(t, s, relayHoldAnswer, func() {
		errs = s.Commit(ctx, [][]persistence.Op{
			{&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}},
			{&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
				Role: persistence.RoleUser, Content: "not what seq 1 holds", CreatedAt: t0}}},
			{&persistence.EndSession{SessionID: "s0"}}, // no time: invalid on its face
		})
	})
	if len(asked) == 0 || asked[len(asked)-1] != "committed" {
		t.Fatalf("the server was asked for the transaction's fate and answered %q, want \"committed\" last: the test does not test", asked)
	}
	if errs[0] != nil {
		t.Errorf("group 0 = %v, want nil (the server committed it)", errs[0])
	}
	if !errors.Is(errs[1], ErrConflict) || errors.Is(errs[1], persistence.ErrUnavailable) {
		t.Errorf("group 1 (refused for what it holds) = %v, want ErrConflict, not ErrUnavailable", errs[1])
	}
	if errs[2] == nil || errors.Is(errs[2], persistence.ErrUnavailable) {
		t.Errorf("group 2 (invalid on its face) = %v, want its own error, not ErrUnavailable", errs[2])
	}
	if n := mustAttempts(t, admin, "s0", 1); n != 1 {
		t.Errorf("attempts of s0/1 = %d, want 1", n)
	}
}

// TestSettledCommitIsConfirmedOnTheSynchronousStandbys: on a server with synchronous
// replication, a batch of the persistence actor whose COMMIT waits for a standby past the
// store's Timeout is committed on the server (it marks a transaction committed before that
// wait, and pgx's cancel request, sent as it closes the connection, ends the wait: the server
// then commits it on its own), so the settle finds it committed; but no standby has it, and a
// failover would lose it. The settle confirms it on the standbys with a transaction of its own
// whose COMMIT waits for them too; here none comes (synchronous_standby_names names one that
// never connects), so it is not confirmed in time: the write is spooled, not acknowledged as
// stored. Before, it was acknowledged as stored. The server is the test's own: the setting is
// the server's, and would hold every commit of the shared one.
func TestSettledCommitIsConfirmedOnTheSynchronousStandbys(t *testing.T) {
	srv := pgtest.NewServer(t, "synchronous_standby_names=nosuch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The tests' server commits asynchronously (synchronous_commit=off), which waits for no
	// standby: the setup does so, and the store under test commits synchronously.
	setup, err := Open(ctx, srv.DSN(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	storetest.MustCommit(t, setup, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1, MessageID: "m0",
			Active: true, Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	s, err := Open(ctx, srv.DSN()+" synchronous_commit=on", Options{NoMigrate: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	defer system.Shutdown()
	spoolFiles := make(chan int, 64)
	pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, s, persistence.ActorOptions{
		MaxBatch: 64, Spool: sp, ReplayEvery: time.Hour, Log: quiet, // a replay would wait for the standby too
		SpoolFiles: func(n int) { spoolFiles <- n },
	})))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()

	var mu sync.Mutex
	var asked []string
	s.asked = func(status string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, status)
	}
	w := &persistence.Write{ID: 1, Ops: []persistence.Op{&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}}
	v, err := system.Root.RequestFuture(pid, w, time.Minute).Result()
	if err != nil {
		t.Fatal(err)
	}
	if res := v.(*persistence.WriteResult); res.Err != nil {
		t.Fatalf("the write = %v, want nil (spooled)", res.Err)
	}
	mu.Lock()
	got := slices.Clone(asked)
	mu.Unlock()
	if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "committed") {
		t.Fatalf("the server was asked for the transaction's fate and answered %q, want \"committed\" last: the test does not test", got)
	}
	spooled := false
	for more := true; more; {
		select {
		case n := <-spoolFiles:
			spooled = spooled || n > 0
		default:
			more = false
		}
	}
	if !spooled {
		t.Errorf("the write was acknowledged as stored, not spooled, though no synchronous standby has it (asked: %q)", got)
	}
}
