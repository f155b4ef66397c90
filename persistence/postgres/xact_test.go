package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// What a commitRelay does to the next COMMIT it meets.
const (
	relayPass       int32 = iota
	relayCutAnswer        // drops the COMMIT's answer and ends the connection, both ways
	relayHoldCommit       // drops the COMMIT and ends the client's side, keeping the server's
	relayHoldAnswer       // passes nothing more to the client from the COMMIT's answer on
	relayMuteCommit       // drops the COMMIT, passing on what the client sends after it
)

// commitDone is a CommandComplete message of a COMMIT: the server committed.
var commitDone = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

// commitRelay passes a test database's connections through a Unix socket of its own, and
// breaks the connection of the next COMMIT once armed (mode): after the server committed, as a
// network that fails between the server's answer and the client does (relayCutAnswer), or
// before the COMMIT reaches the server, which keeps the transaction open while the server's
// side of the connection lasts (relayHoldCommit; release ends it).
type commitRelay struct {
	dsn  string
	mode atomic.Int32
	cuts atomic.Int32 // connections broken at a COMMIT
	mu   sync.Mutex
	held []net.Conn // the server's side of the connections relayHoldCommit broke
	// atHold, when set, is called once relayHoldCommit dropped a COMMIT, before the client's
	// side of its connection is ended.
	atHold func()
}

func newCommitRelay(t *testing.T, dsn string) *commitRelay {
	t.Helper()
	r := &commitRelay{}
	isCommit := isQuery("commit") // pgx's Tx.Commit: a simple query
	r.dsn, _ = relayConns(t, dsn, "pgcommit", func(c, up net.Conn) func(dst, src net.Conn, fromClient bool) {
		var holding atomic.Bool // the client's side waits for atHold: the server's end passes not to it
		pass := func(dst, src net.Conn, fromClient bool) {
			buf := make([]byte, 32<<10)
			swallow := false // passes nothing more on
			for {
				n, err := src.Read(buf)
				// A client writes a query whole, and the server a COMMIT's answer with
				// the ReadyForQuery after it, so one read holds all of it.
				switch {
				case fromClient && isCommit(buf[:n]) && r.mode.CompareAndSwap(relayHoldCommit, relayPass):
					r.mu.Lock()
					r.held = append(r.held, up)
					atHold := r.atHold
					r.mu.Unlock()
					r.cuts.Add(1)
					if atHold != nil {
						holding.Store(true)
						atHold()
					}
					_ = c.Close()
					return
				case !fromClient && bytes.Contains(buf[:n], commitDone) && r.mode.CompareAndSwap(relayCutAnswer, relayPass):
					r.cuts.Add(1)
					_, _ = c.Close(), up.Close()
					return
				case !fromClient && bytes.Contains(buf[:n], commitDone) && r.mode.CompareAndSwap(relayHoldAnswer, relayPass):
					r.cuts.Add(1)
					swallow = true // until the server closes its side, once the client closed its own
				case fromClient && isCommit(buf[:n]) && r.mode.CompareAndSwap(relayMuteCommit, relayPass):
					r.cuts.Add(1)
					continue
				}
				if !fromClient && holding.Load() {
					return
				}
				if n > 0 && !swallow {
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
		return pass
	})
	return r
}

// release ends the server's side of the connections relayHoldCommit broke: the server ends
// their sessions, aborting their transactions.
func (r *commitRelay) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, up := range r.held {
		_ = up.Close()
	}
	r.held = nil
}

// cutAnswerOf runs call, a call of s through r, with r set to cut the next COMMIT's answer,
// fails the test unless it cut one, and returns what the server answered s when asked for
// the transaction's fate meanwhile.
func (r *commitRelay) cutAnswerOf(t *testing.T, s *Store, call func()) (asked []string) {
	t.Helper()
	return r.armedFor(t, s, relayCutAnswer, call)
}

// armedFor runs call, a call of s through r, with r armed with mode for the next COMMIT, fails
// the test unless the relay met one, and returns what the server answered s when asked for
// the transaction's fate meanwhile.
func (r *commitRelay) armedFor(t *testing.T, s *Store, mode int32, call func()) (asked []string) {
	t.Helper()
	var mu sync.Mutex
	s.asked = func(status string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, status)
	}
	before := r.cuts.Load()
	r.mode.Store(mode)
	call()
	if n := r.cuts.Load() - before; n != 1 {
		t.Fatalf("the relay met %d COMMITs, want 1: the test does not test", n)
	}
	mu.Lock()
	defer mu.Unlock()
	s.asked = nil
	return slices.Clone(asked)
}

// openRelayed opens a store of a new test database through a commitRelay, and returns it, the
// relay and the database's own dsn.
func openRelayed(t *testing.T) (*Store, *commitRelay, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	r := newCommitRelay(t, dsn)
	s, err := Open(context.Background(), r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, r, dsn
}

// mustAttempts returns the attempts counter of the message sessionID/seq.
func mustAttempts(t *testing.T, c *pgx.Conn, sessionID string, seq int64) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), `SELECT attempts FROM messages WHERE session_id = $1 AND seq = $2`,
		sessionID, seq).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLostCommitAnswerOfACommittedTransactionIsTaken: a commit whose connection breaks after
// the server committed it, before its answer reaches the store (a relay ends the connection
// when it sees the COMMIT's CommandComplete), succeeds: the server's record of the transaction
// (pg_xact_status, by the id its batch read) says it committed. Its writes are stored, and its
// attempt counter counted once; a group the savepoint pass refused keeps its own error. Before,
// the call failed with ErrUnavailable: a daemon spooled the writes and replayed them, and the
// counter counted twice (without a spool, the sender was told its message was not stored).
func TestLostCommitAnswerOfACommittedTransactionIsTaken(t *testing.T) {
	s, r, dsn := openRelayed(t)
	admin := mustConn(t, dsn)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		groups func(id string) [][]persistence.Op
		refuse int // the index of the group refused for what it holds, or -1
	}{
		{"one pass", func(id string) [][]persistence.Op {
			return [][]persistence.Op{
				{&persistence.IncrementAttempts{SessionID: id, Seqs: []int64{1}},
					&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 2,
						Role: persistence.RoleAssistant, Content: "answer", CreatedAt: t0}}},
				{&persistence.CreateSession{Session: newSession(id+"-next", "k"+id+"-next")}},
			}
		}, -1},
		{"savepoints", func(id string) [][]persistence.Op {
			return [][]persistence.Op{
				{&persistence.IncrementAttempts{SessionID: id, Seqs: []int64{1}},
					&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 2,
						Role: persistence.RoleAssistant, Content: "answer", CreatedAt: t0}}},
				{&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 1,
					Role: persistence.RoleUser, Content: "not what seq 1 holds", CreatedAt: t0}}},
				{&persistence.CreateSession{Session: newSession(id+"-next", "k"+id+"-next")}},
			}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "s-" + tc.name[:3]
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(id, "k"+id)},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 1,
					Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
			before := r.cuts.Load()
			r.mode.Store(relayCutAnswer)
			errs := s.Commit(ctx, tc.groups(id))
			if got := r.cuts.Load() - before; got != 1 {
				t.Fatalf("the relay cut %d COMMIT answers, want 1: the test does not test", got)
			}
			for i, err := range errs {
				switch {
				case i == tc.refuse && !errors.Is(err, ErrConflict):
					t.Errorf("group %d (refused for what it holds) = %v, want ErrConflict", i, err)
				case i != tc.refuse && err != nil:
					t.Errorf("group %d of a commit whose answer was lost after the server committed it = %v, want nil", i, err)
				}
			}
			if n := mustAttempts(t, admin, id, 1); n != 1 {
				t.Errorf("attempts of %s/1 = %d, want 1 (counted once)", id, n)
			}
			var stored int
			if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM messages WHERE session_id = $1 AND seq = 2)
				+ (SELECT count(*) FROM sessions WHERE id = $1 || '-next')`, id).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if stored != 2 {
				t.Errorf("%d of the commit's 2 rows are stored, want both", stored)
			}
		})
	}
}

// TestLostCommitAnswerOfATransactionThatWroteNothingIsTaken: a commit whose transaction wrote
// nothing (writes sent again that are stored already, as a spool's replay sends them: its batch
// read no transaction id) and whose connection breaks as the COMMIT's answer passes succeeds
// without asking the server: every earlier answer of its batch came, and its COMMIT had nothing
// to apply. A group the savepoint pass refused keeps its own error. Before, the call failed
// with ErrUnavailable, though nothing of it could be lost. A store that holds the daemon lock
// reads the lock's row FOR SHARE in each commit (its fence), which gives the transaction an
// id: such a commit is asked for, as one that wrote.
func TestLostCommitAnswerOfATransactionThatWroteNothingIsTaken(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	r := newCommitRelay(t, dsn)
	unlocked, err := Open(ctx, r.dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer unlocked.Close()
	locked, lr, _ := openRelayed(t)
	hi := &persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
		Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}}
	stored := []persistence.Op{&persistence.CreateSession{Session: newSession("s0", "k0")}, hi}
	for _, tc := range []struct {
		name   string
		s      *Store
		r      *commitRelay
		groups [][]persistence.Op
		refuse int      // the index of the group refused for what it holds, or -1
		asked  []string // the server's answers when asked for the transaction's fate
	}{
		{"one pass", unlocked, r, [][]persistence.Op{stored}, -1, nil},
		{"savepoints", unlocked, r, [][]persistence.Op{stored, {&persistence.AppendMessage{Message: persistence.Message{
			SessionID: "s0", Seq: 1, Role: persistence.RoleUser, Content: "not what seq 1 holds", CreatedAt: t0}}}, {hi}}, 1, nil},
		{"the daemon lock's fence", locked, lr, [][]persistence.Op{stored}, -1, []string{"committed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.MustCommit(t, tc.s, stored...)
			var errs []error
			asked := tc.r.cutAnswerOf(t, tc.s, func() { errs = tc.s.Commit(ctx, tc.groups) })
			for i, err := range errs {
				switch {
				case i == tc.refuse && !errors.Is(err, ErrConflict):
					t.Errorf("group %d (refused for what it holds) = %v, want ErrConflict", i, err)
				case i != tc.refuse && err != nil:
					t.Errorf("group %d of a commit that wrote nothing and whose answer was lost = %v, want nil", i, err)
				}
			}
			if !slices.Equal(asked, tc.asked) {
				t.Errorf("the server was asked for the transaction's fate and answered %q, want %q", asked, tc.asked)
			}
		})
	}
}

// TestLostCommitAnswerOfTheStoresOwnTransactionIsTaken: BeginRun and a pardon, whose
// connection breaks after the server committed them (the relay ends it as the COMMIT's answer
// passes), succeed as a commit does: the server's record of the transaction, by the id it read
// before its COMMIT, says it committed. BeginRun returns the unclean stop it counted, once, and
// a pardon what it pardoned. Before, both failed with ErrUnavailable: the daemon wrote the
// record of its run again a second later, which counted an unclean stop of the run itself (a
// strike against each head pending message it had begun, or had not counted yet), and the CLI
// said a pardon done had failed.
func TestLostCommitAnswerOfTheStoresOwnTransactionIsTaken(t *testing.T) {
	s, r, dsn := openRelayed(t)
	admin := mustConn(t, dsn)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k0", SessionID: "s0", Generation: 1, UpdatedAt: t0}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1, MessageID: "m1", Active: true,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	if _, err := s.BeginRun(ctx, "r1", t0); err != nil { // a run that dies: the next start counts it
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		call     func() (any, error)
		want     any
		attempts int    // of s0/1 after the call
		run      string // the run recorded after the call
	}{
		{"begin run", func() (any, error) {
			u, err := s.BeginRun(ctx, "r2", t0.Add(time.Minute))
			if u == nil {
				return nil, err
			}
			return *u, err
		}, persistence.UncleanStop{Run: "r1", StartedAt: t0, Counted: []persistence.CountedMessage{
			{Key: "k0", SessionID: "s0", MessageID: "m1", Attempts: 1}}}, 1, "r2"},
		{"pardon", func() (any, error) { return s.Pardon(ctx, "") },
			persistence.Pardoned{Messages: 1, Sessions: 1}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got any
			var err error
			asked := r.cutAnswerOf(t, s, func() { got, err = tc.call() })
			if err != nil {
				t.Errorf("%s whose answer was lost after the server committed it = %v, want nil", tc.name, err)
			} else if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s whose answer was lost after the server committed it (-want +got):\n%s", tc.name, diff)
			}
			if !slices.Equal(asked, []string{"committed"}) {
				t.Errorf("the server was asked for the transaction's fate and answered %q, want 'committed'", asked)
			}
			if n := mustAttempts(t, admin, "s0", 1); n != tc.attempts {
				t.Errorf("attempts of s0/1 = %d, want %d", n, tc.attempts)
			}
			var run string
			if err := admin.QueryRow(ctx, `SELECT run FROM daemon_run`).Scan(&run); err != nil {
				t.Fatal(err)
			}
			if run != tc.run {
				t.Errorf("the run recorded = %q, want %q", run, tc.run)
			}
		})
	}
}

// TestUnansweredCommitOfTheStoresOwnTransactionIsSettled: BeginRun and a pardon whose
// COMMIT's answer does not come within the store's Timeout (a relay holds it, the server
// having committed) are settled as those whose connection broke there are: the server's
// record of the transaction, asked on a fresh connection, says it committed, and the call
// succeeds, BeginRun with the unclean stop it counted, once. One whose COMMIT never reached
// the server (the relay drops it; the server aborts the transaction once pgx closes the
// connection at the timeout) fails with ErrUnavailable and wrote nothing: a BeginRun run
// again names the run before it as the last. Before, a COMMIT unanswered in time failed at
// once with ErrUnavailable: the daemon wrote its run's record again, and the next start
// counted an unclean stop of a run that had stopped cleanly, or this one of its own.
func TestUnansweredCommitOfTheStoresOwnTransactionIsSettled(t *testing.T) {
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
		&persistence.PutRoute{Route: persistence.Route{Key: "k0", SessionID: "s0", Generation: 1, UpdatedAt: t0}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1, MessageID: "m1", Active: true,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	if _, err := s.BeginRun(ctx, "r1", t0); err != nil { // a run that dies: the next start counts it
		t.Fatal(err)
	}
	beginRun := func(run string) func() (any, error) {
		return func() (any, error) {
			u, err := s.BeginRun(ctx, run, t0.Add(time.Minute))
			if u == nil {
				return nil, err
			}
			return *u, err
		}
	}
	for _, tc := range []struct {
		name     string
		mode     int32
		call     func() (any, error)
		want     any
		wantErr  error  // errors.Is of the call's error; nil for nil
		asked    string // the server's last answer when asked for the transaction's fate
		attempts int    // of s0/1 after the call
		run      string // the run recorded after the call
	}{
		{"begin run committed", relayHoldAnswer, beginRun("r2"), persistence.UncleanStop{Run: "r1", StartedAt: t0,
			Counted: []persistence.CountedMessage{{Key: "k0", SessionID: "s0", MessageID: "m1", Attempts: 1}}},
			nil, "committed", 1, "r2"},
		{"begin run aborted", relayMuteCommit, beginRun("r3"), nil, persistence.ErrUnavailable, "aborted", 1, "r2"},
		{"begin run again", relayPass, beginRun("r3"), persistence.UncleanStop{Run: "r2", StartedAt: t0.Add(time.Minute)},
			nil, "", 1, "r3"},
		{"pardon committed", relayHoldAnswer, func() (any, error) { return s.Pardon(ctx, "") },
			persistence.Pardoned{Messages: 1, Sessions: 1}, nil, "committed", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got any
			var err error
			call := func() { got, err = tc.call() }
			var asked []string
			if tc.mode == relayPass {
				call()
			} else {
				asked = r.armedFor(t, s, tc.mode, call)
			}
			if (tc.wantErr == nil && err != nil) || !errors.Is(err, tc.wantErr) {
				t.Errorf("%s = %v, want %v", tc.name, err, tc.wantErr)
			} else if diff := cmp.Diff(tc.want, got); err == nil && diff != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, diff)
			}
			if last := ""; tc.asked != "" {
				if len(asked) > 0 {
					last = asked[len(asked)-1]
				}
				if last != tc.asked {
					t.Errorf("the server was asked for the transaction's fate and answered %q, want %q last", asked, tc.asked)
				}
			}
			if n := mustAttempts(t, admin, "s0", 1); n != tc.attempts {
				t.Errorf("attempts of s0/1 = %d, want %d", n, tc.attempts)
			}
			var run string
			if err := admin.QueryRow(ctx, `SELECT run FROM daemon_run`).Scan(&run); err != nil {
				t.Fatal(err)
			}
			if run != tc.run {
				t.Errorf("the run recorded = %q, want %q", run, tc.run)
			}
		})
	}
}

// TestLostCommitAnswerOfATransactionInProgress: a commit whose connection breaks after its
// COMMIT was sent while the server still runs its transaction (here the COMMIT never reached
// the server, which keeps the transaction open while its side of the connection lasts) asks
// the server again, briefly: a transaction the server aborts meanwhile runs again and succeeds,
// once; one it still runs after xactAsks asks fails with ErrUnavailable, as before (a daemon
// spools it), and is not run again. Before, both failed at once with ErrUnavailable.
func TestLostCommitAnswerOfATransactionInProgress(t *testing.T) {
	s, r, dsn := openRelayed(t)
	admin := mustConn(t, dsn)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	var mu sync.Mutex
	var asked []string
	var abort bool // end the held transaction at the first answer 'in progress'
	s.asked = func(status string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, status)
		if !abort || status != "in progress" {
			return
		}
		abort = false
		var ended int
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
			FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&ended); err != nil || ended != 1 {
			t.Errorf("end the held transaction: ended %d, %v; want 1", ended, err)
		}
	}
	for _, tc := range []struct {
		name   string
		abort  bool
		id     string
		want   error // errors.Is of the call's error; nil for nil
		asks   int
		stored bool
	}{
		{"aborted meanwhile", true, "s1", nil, 2, true},
		{"still running", false, "s2", persistence.ErrUnavailable, xactAsks, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			asked, abort = nil, tc.abort
			mu.Unlock()
			defer r.release()
			before := r.cuts.Load()
			r.mode.Store(relayHoldCommit)
			err := s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession(tc.id, "k"+tc.id)},
				&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}})[0]
			if got := r.cuts.Load() - before; got != 1 {
				t.Fatalf("the relay held %d COMMITs, want 1: the test does not test", got)
			}
			if (tc.want == nil && err != nil) || !errors.Is(err, tc.want) {
				t.Errorf("Commit whose COMMIT the server did not get = %v, want %v", err, tc.want)
			}
			mu.Lock()
			got := asked
			mu.Unlock()
			if len(got) != tc.asks || got[0] != "in progress" {
				t.Errorf("the store asked for the transaction's fate %d times, answered %q; want %d, the first 'in progress'",
					len(got), got, tc.asks)
			}
			r.release()
			var stored bool
			if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1)`, tc.id).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if stored != tc.stored {
				t.Errorf("session %s stored = %v, want %v", tc.id, stored, tc.stored)
			}
		})
	}
	// Each aborted transaction counted nothing; the one run again, once. (The one still
	// running when released counts nothing either once the server ends it.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var open int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the released transaction is still open 10 s on")
		}
		time.Sleep(time.Millisecond) // polls the server under a deadline
	}
	if n := mustAttempts(t, admin, "s0", 1); n != 1 {
		t.Errorf("attempts of s0/1 = %d, want 1 (once, by the commit run again)", n)
	}
}

// TestLostCommitAnswerOfATransactionACrashLost: a commit whose connection breaks after its
// COMMIT was sent, as the server crashes (a process of it killed: the postmaster ends every
// session, recovers from its WAL and runs on, pg_postmaster_start_time unchanged), before the
// transaction's WAL reached the disk, wrote nothing; and the server, recovered, gives its id
// to another transaction, which commits. Asked for the fate of that id, the server answers
// 'committed', of the other transaction: the commit is not taken as applied, since the reset
// time of the server's shared statistics, which its batch read with the id, changed with the
// crash. It fails with ErrUnavailable (a daemon spools it), nothing of it stored. Before, the
// start time alone told the server's run, and the call succeeded: its writes silently lost.
func TestLostCommitAnswerOfATransactionACrashLost(t *testing.T) {
	srv := pgtest.NewServer(t)
	ctx := context.Background()
	// The WAL writer, which writes the WAL of a transaction not yet committed every
	// wal_writer_delay, waits until after the crash, and the background writer, which writes
	// it before a page it changed, writes no page: a restart sets them.
	func() {
		c := mustConn(t, srv.DSN())
		defer c.Close(ctx)
		for _, q := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `ALTER SYSTEM SET bgwriter_lru_maxpages = 0`} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}()
	srv.Restart(t)
	r := newCommitRelay(t, srv.DSN())
	s, err := Open(ctx, r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	admin := mustConn(t, srv.DSN())
	if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil { // what is stored so far is on disk
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string
	s.asked = func(status string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, status)
	}
	var reused atomic.Bool // set on the relay's goroutine
	var before string      // the reset time of the shared statistics, which the crash's recovery sets
	if err := admin.QueryRow(ctx, `SELECT pg_stat_get_bgwriter_stat_reset_time()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	r.atHold = func() { // on the relay's goroutine: t.Error, not t.Fatal
		var pid int
		var xid string
		if err := admin.QueryRow(ctx, `SELECT pid, backend_xid::text FROM pg_stat_activity
			WHERE state = 'idle in transaction' AND backend_xid IS NOT NULL`).Scan(&pid, &xid); err != nil {
			t.Errorf("find the held transaction: %v", err)
			return
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Errorf("crash the server: %v", err)
			return
		}
		x, _ := strconv.ParseUint(xid, 10, 64)
		// The server is recovered once a connection reads another reset time: one made before
		// the postmaster learned of the crash is ended by it (CI met a broken pipe so), and one
		// made during the recovery is refused. Until then, and on any error, it tries again.
		deadline := time.Now().Add(30 * time.Second)
		var last error
		for !time.Now().After(deadline) {
			if done, err := takeIDsUpTo(ctx, srv.DSN(), before, x); err != nil {
				last = err
			} else if done != nil {
				reused.Store(*done)
				return
			}
			time.Sleep(10 * time.Millisecond) // polls the recovering server under a deadline
		}
		t.Errorf("the server did not recover from its crash in 30 s: %v", last)
	}
	r.mode.Store(relayHoldCommit)
	err = s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}})[0]
	if r.cuts.Load() != 1 || !reused.Load() {
		t.Fatalf("the relay held %d COMMITs, and the lost transaction's id was taken again: %v; want 1, true: the test does not test",
			r.cuts.Load(), reused.Load())
	}
	if !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("Commit of a transaction a crash lost, whose id another transaction took and committed = %v, want ErrUnavailable", err)
	}
	mu.Lock()
	if len(asked) == 0 || asked[len(asked)-1] != "committed" {
		t.Errorf("the server answered %q, want 'committed' last (the other transaction's fate): the test does not test", asked)
	}
	mu.Unlock()
	c := mustConn(t, srv.DSN())
	var stored bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sessions WHERE id = 's1')`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored {
		t.Error("session s1 stored, want not: the crash lost the transaction")
	}
	if n := mustAttempts(t, c, "s0", 1); n != 0 {
		t.Errorf("attempts of s0/1 = %d, want 0", n)
	}
}

// takeIDsUpTo connects to dsn and, once the server's shared statistics were reset since before
// (its crash's recovery), takes transaction ids until one is x or past it: done reports whether
// x was taken again. It returns nil, nil while the server has not recovered.
func takeIDsUpTo(ctx context.Context, dsn, before string, x uint64) (done *bool, err error) {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	var reset string
	if err := c.QueryRow(ctx, `SELECT pg_stat_get_bgwriter_stat_reset_time()::text`).Scan(&reset); err != nil {
		return nil, err
	}
	if reset == before {
		return nil, nil
	}
	for { // other transactions take ids until one takes the lost transaction's
		var id string
		if err := c.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&id); err != nil {
			return nil, fmt.Errorf("take a transaction id: %w", err)
		}
		if n, _ := strconv.ParseUint(id, 10, 64); n >= x {
			reused := n == x
			return &reused, nil
		}
	}
}

// TestKnowsXactsByServerVersion: a commit reads its transaction's id on PostgreSQL 15 or later
// only, by the version the server reports at a connection's start: a server before 13 lacks
// pg_current_xact_id_if_assigned and pg_xact_status (its commits' batches would fail), and one
// before 15 keeps its shared statistics, whose reset time tells its run (serverRun), in the
// statistics collector's file, which each commit would read.
func TestKnowsXactsByServerVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"15.5 (Debian 15.5-1.pgdg120+1)": true,
		"15.0":                           true,
		"16beta1":                        true,
		"14.10":                          false,
		"13.0":                           false,
		"12.17":                          false,
		"9.6.24":                         false,
		"":                               false,
		"unknown":                        false,
	} {
		if got := knowsXacts(v); got != want {
			t.Errorf("knowsXacts(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestLostCommitAnswerAsTheCallsBoundRunsOutIsAsked: a commit whose connection breaks once its
// COMMIT was sent (the relay cuts the answer, the server having committed) while the call's
// bound has time left, and whose bound runs out before the fate is asked (the test holds the
// ask until it does), is settled on the server's record all the same, asked within a bound of
// its own (fateBound): a batch's groups succeed, and BeginRun returns the unclean stop it
// counted. It is what the server's idle_in_transaction_session_timeout, equal to the
// Timeout, does to a COMMIT lost on its way on a loaded host: it ends the session a moment
// before the call's bound runs out. Before, the fate was asked on the call's context, ended,
// and the ask failed ("context deadline exceeded"): the writes failed as unavailable, to be
// spooled and replayed, their counters counting twice (TestUnansweredCommitOfABatchIsSettled/
// never_reached_the_server failed so beside CPU load, asked for an aborted transaction).
func TestLostCommitAnswerAsTheCallsBoundRunsOutIsAsked(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := newCommitRelay(t, dsn)
	ctx := context.Background()
	s, err := Open(ctx, r.dsn, Options{Exclusive: true, LockCheckInterval: time.Hour, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := mustConn(t, dsn)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k0", SessionID: "s0", Generation: 1, UpdatedAt: t0}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1, MessageID: "m1", Active: true,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	if _, err := s.BeginRun(ctx, "r1", t0); err != nil { // a run that dies: the next start counts it
		t.Fatal(err)
	}
	var ended atomic.Int32 // the calls whose bound the test let run out before the ask
	s.lost = func(ctx context.Context) {
		<-ctx.Done()
		ended.Add(1)
	}
	defer func() { s.lost = nil }()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"commit", func() error {
			err := s.Commit(ctx, [][]persistence.Op{{&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}})[0]
			if n := mustAttempts(t, admin, "s0", 1); n != 1 {
				t.Errorf("attempts of s0/1 = %d, want 1 (counted once)", n)
			}
			return err
		}},
		{"begin run", func() error {
			stop, err := s.BeginRun(ctx, "r2", t0.Add(time.Minute))
			if err == nil && (stop == nil || stop.Run != "r1") {
				t.Errorf("BeginRun counted the unclean stop of %+v, want r1's", stop)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ended.Load()
			var err error
			asked := r.cutAnswerOf(t, s, func() { err = tc.call() })
			if ended.Load() != before+1 {
				t.Fatal("the call's connection was not lost while its bound ran: the test does not test")
			}
			if err != nil {
				t.Errorf("%s whose answer was lost after the server committed it = %v, want nil", tc.name, err)
			}
			if !slices.Equal(asked, []string{"committed"}) {
				t.Errorf("the server was asked for the transaction's fate and answered %q, want 'committed'", asked)
			}
		})
	}
}
