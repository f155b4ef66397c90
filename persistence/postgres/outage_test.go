package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/jackc/pgx/v5"
)

// mustExpire makes member id's registration expire, as a dead member's does, without a wait:
// its ttl becomes a microsecond, which its last renewal is older than. Moving the renewal back
// instead could take it before the database server's start, and a claim counts no death of a
// member that last renewed before then (sinceServerStart).
func mustExpire(t testing.TB, conn *pgx.Conn, id string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), `UPDATE members SET ttl_secs = 0.000001 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// TestClaimCountsNoDeathOfADatabaseRestart: an outage of the database longer than member_ttl
// (here a real restart of the server) stops every member, and each is started again once the
// database is back, on its port or on another one. The claims that take their keys over then
// count no death: the members last renewed before the server started, so the outage may have
// been their death. Before, each key's head pending message counted one, and three such
// outages quarantined a message that had killed nothing (an audit's finding). Deaths after the
// restart count as ever, whether the member's registration expires or a newer member
// registers its address.
func TestClaimCountsNoDeathOfADatabaseRestart(t *testing.T) {
	srv := pgtest.NewServer(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	open := func() *Store {
		t.Helper()
		s, err := Open(ctx, srv.DSN(), Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := open()
	mustPendingSessions(t, s, "a", "b")
	beat := func(m Member) {
		t.Helper()
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(key, owner string) persistence.Claimed { return mustClaim(t, s, key, owner) }
	p := Member{ID: "p", Host: "10.0.0.1", Port: 6340, Node: "h1/r_p"}
	q := Member{ID: "q", Host: "10.0.0.2", Port: 6340, Node: "h2/r_q"}
	beat(p)
	beat(q)
	claim("ka", p.Node)
	claim("kb", q.Node)

	// The outage: the server restarts, and no member renews meanwhile. Both stop, and their
	// process supervisor starts them again: p on its port, q on another one, and q's old
	// registration has expired.
	srv.Restart(t)
	s.Close()
	s = open()
	conn := mustConn(t, srv.DSN())
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'q'`); err != nil {
		t.Fatal(err)
	}
	p2 := Member{ID: "p2", Host: p.Host, Port: p.Port, Node: "h1/r_p2"}
	q2 := Member{ID: "q2", Host: q.Host, Port: 41000, Node: "h2/r_q2"}
	beat(p2)
	beat(q2)
	if c := claim("ka", p2.Node); c.Counted != nil {
		t.Errorf("claim after the restart from a member restarted on its port: counted %+v, want nothing", *c.Counted)
	}
	if c := claim("kb", q2.Node); c.Counted != nil {
		t.Errorf("claim after the restart from a member whose registration expired: counted %+v, want nothing", *c.Counted)
	}

	// Deaths with the server not restarted: p2 dies holding ka (its registration expires), and
	// q2, holding kb, is restarted on its port.
	mustExpire(t, conn, p2.ID)
	if c := claim("ka", q2.Node); c.Counted == nil || c.Counted.MessageID != "a-m1" || c.Counted.Attempts != 1 {
		t.Errorf("claim from a member that died after the restart: %s, want a-m1 counted (1 attempt)", counted(c))
	}
	q3 := Member{ID: "q3", Host: q2.Host, Port: q2.Port, Node: "h2/r_q3"}
	beat(q3)
	if c := claim("kb", q3.Node); c.Counted == nil || c.Counted.MessageID != "b-m1" || c.Counted.Attempts != 1 {
		t.Errorf("claim from a member restarted on its port after the restart: %s, want b-m1 counted (1 attempt)", counted(c))
	}
}

// mustPendingSessions commits, for each of ids, a session routed at key "k"+id with one pending
// message, id+"-m1".
func mustPendingSessions(t testing.TB, s *Store, ids ...string) {
	t.Helper()
	var ops []persistence.Op
	for _, sid := range ids {
		ops = append(ops, &persistence.CreateSession{Session: newSession(sid, "k"+sid)},
			&persistence.PutRoute{Route: persistence.Route{Key: "k" + sid, SessionID: sid, Generation: 1, UpdatedAt: t0}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 1, Role: persistence.RoleUser,
				Content: "hi", Platform: "http", ChatID: "c", MessageID: sid + "-m1", UserID: "u",
				Status: persistence.StatusPending, Active: true, CreatedAt: t0}})
	}
	storetest.MustCommit(t, s, ops...)
}

// mustClaim claims key for owner at t0.
func mustClaim(t testing.TB, s *Store, key, owner string) persistence.Claimed {
	t.Helper()
	c, err := s.Claim(context.Background(), key, owner, t0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// counted describes what a claim counted.
func counted(c persistence.Claimed) string {
	if c.Counted == nil {
		return "nothing counted"
	}
	return fmt.Sprintf("%+v", *c.Counted)
}

// TestClaimCountsNoDeathOfAMemberThatStoppedItself: an outage of the database that is no
// restart of the server (a failover, a network cut, a server too slow to answer) and lasts
// longer than member_ttl stops every member: each stops itself, and its successor on the same
// data directory records so (RecordSelfStops) before it claims anything. A claim then counts
// no death of a member so recorded, nor of one that last renewed within member_ttl of it (the
// same outage, its own successor not started yet). A member that died apart from the outage
// counts, as does every member of another cluster on the same database.
func TestClaimCountsNoDeathOfAMemberThatStoppedItself(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	mustPendingSessions(t, s, "a", "b", "c", "d")
	claim := func(key, owner string) persistence.Claimed { return mustClaim(t, s, key, owner) }
	p := Member{ID: "p", Host: "10.0.0.1", Port: 6340, Node: "h1/r_p"}
	q := Member{ID: "q", Host: "10.0.0.2", Port: 6340, Node: "h2/r_q"}
	r := Member{ID: "r", Host: "10.0.0.3", Port: 6340, Node: "h3/r_r"}
	x := Member{ID: "x", Host: "10.0.0.4", Port: 6340, Node: "h4/r_x"} // of another cluster
	for _, m := range []Member{p, q, r} {
		if _, err := s.Heartbeat(ctx, "c1", m, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Heartbeat(ctx, "c2", x, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	claim("ka", p.Node)
	claim("kb", q.Node)
	claim("kc", r.Node)
	claim("kd", x.Node)
	// The outage: p and q last renewed at the same moment, just before it; r died 5 ms before
	// that, of something else; x, of another cluster, renewed with p and q. Their member_ttl is
	// 1 ms, so all are gone now, and none of them renewed before the server started.
	if _, err := conn.Exec(ctx, `UPDATE members SET ttl_secs = 0.001,
		heartbeat_at = (SELECT max(heartbeat_at) FROM members) - CASE WHEN id = 'r' THEN interval '7 ms' ELSE interval '2 ms' END`); err != nil {
		t.Fatal(err)
	}
	// p's successor on its data directory records p's stop (and one of a node with no row).
	if n, err := s.RecordSelfStops(ctx, "c1", []string{p.Node, "h9/r_gone"}); err != nil || n != 1 {
		t.Fatalf("RecordSelfStops = %d, %v; want 1 member marked", n, err)
	}
	if c := claim("ka", "h1/r_p2"); c.Counted != nil {
		t.Errorf("claim of the key of a member that stopped itself: counted %+v, want nothing", *c.Counted)
	}
	if c := claim("kb", "h1/r_p2"); c.Counted != nil {
		t.Errorf("claim of the key of a member gone in the same outage, not recorded yet: counted %+v, want nothing", *c.Counted)
	}
	if c := claim("kc", "h1/r_p2"); c.Counted == nil || c.Counted.MessageID != "c-m1" || c.Counted.Attempts != 1 {
		t.Errorf("claim of the key of a member that died apart from the outage: %s, want c-m1 counted (1 attempt)", counted(c))
	}
	if c := claim("kd", "h5/r_y"); c.Counted == nil || c.Counted.MessageID != "d-m1" || c.Counted.Attempts != 1 {
		t.Errorf("claim of the key of another cluster's member: %s, want d-m1 counted (1 attempt)", counted(c))
	}
}

// TestLostLockIsTakenAgainWithinASecond: a store that lost its daemon lock in an outage (here
// its Ping found the lock's connection ended while the database refused connections) takes it
// again within about a second of the database answering, and its writes are taken from then
// on, whatever its lock check's interval (an hour here). Before, the lock was tried again only
// at the next lock check (5 s by default), and every write was refused until then: a cluster
// soak's stopping member waited about 4 s after PostgreSQL was back before the turn results it
// held could be written.
func TestLostLockIsTakenAgainWithinASecond(t *testing.T) {
	// The poll's deadline is far below the lock check's interval (an hour), which the lock is
	// taken again before only by its retake (lockRetakeEvery), and far above that second: the
	// retake is a new connection and four statements, which on a loaded machine (the race
	// detector, other tests' servers) can take seconds. A deadline of 3 s left two for them.
	const retakeDeadline = 30 * time.Second
	for name, opts := range lockHolders() {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.NewDatabase(t)
			ctx := context.Background()
			s, err := Open(ctx, dsn, opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			restore := pgtest.Cut(t, dsn)
			if err := s.Ping(ctx); err == nil {
				t.Fatal("Ping with the database cut = nil, want an error")
			}
			if !s.lockGone() {
				t.Fatal("the store still holds its lock with the database cut: the test does not test")
			}
			restore()
			back := time.Now()
			for {
				errs := s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})
				if errs[0] == nil {
					break
				}
				if took := time.Since(back); took > retakeDeadline {
					t.Fatalf("commit %v after the database was back: %v, want it taken within about a second (lockRetakeEvery)", took.Round(time.Millisecond), errs[0])
				}
				time.Sleep(50 * time.Millisecond) // a real server: poll under a deadline
			}
			t.Logf("the lock was taken again and a commit taken %v after the database was back", time.Since(back).Round(time.Millisecond))
			if _, err := s.Session(ctx, "s1"); err != nil {
				t.Errorf("Session(s1) after its commit was taken: %v", err)
			}
		})
	}
}

// TestLostLockIsAWarningUntilItLasts: a store that loses its daemon lock in an outage logs the
// loss at WRN, once, and at ERR (a human must act) only once the loss has lasted lockLostAlarm,
// once; the retake logs its WRN line. Before, every loss was an ERR at once, though an outage
// of a few seconds (a restart of PostgreSQL, a read-only spell) heals within about a second of
// the database answering: a soak logged one for each member at each outage.
func TestLostLockIsAWarningUntilItLasts(t *testing.T) {
	for name, opts := range lockHolders() {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.NewDatabase(t)
			ctx := context.Background()
			var logs testutil.Buffer
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			s, err := Open(ctx, dsn, opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			count := func(level, msg string) int {
				return strings.Count(logs.String(), "level="+level+" msg=\""+msg)
			}
			lost := "lost the database's daemon lock"
			stillLost := "the database's daemon lock is still lost"
			if opts.Shared {
				lost = "lost the database's shared daemon lock"
				stillLost = "the database's shared daemon lock is still lost"
			}
			const retaken = "took the database's daemon lock again"

			restore := pgtest.Cut(t, dsn)
			for range 3 { // the first check loses the lock; the others (and the watcher's) find it lost
				if err := s.Ping(ctx); err == nil {
					t.Fatal("Ping with the database cut = nil, want an error")
				}
			}
			if n := count("WARN", lost); n != 1 {
				t.Errorf("the loss logged at WRN %d times, want once:\n%s", n, logs.String())
			}
			if n := strings.Count(logs.String(), "level=ERROR"); n != 0 {
				t.Errorf("%d ERR lines for a loss of the lock that has not lasted, want none:\n%s", n, logs.String())
			}

			// The loss lasts: it was found lockLostAlarm ago.
			s.lockMu.Lock()
			s.lockLostAt = s.lockLostAt.Add(-lockLostAlarm)
			s.lockMu.Unlock()
			for range 3 {
				if err := s.Ping(ctx); err == nil {
					t.Fatal("Ping with the database cut = nil, want an error")
				}
			}
			if n := count("ERROR", stillLost); n != 1 {
				t.Errorf("a loss that lasted logged at ERR %d times, want once:\n%s", n, logs.String())
			}

			restore()
			pingUntilRetaken(t, s)
			if n := count("WARN", retaken); n != 1 {
				t.Errorf("the retake logged %d times, want once:\n%s", n, logs.String())
			}
			if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
				t.Errorf("%d ERR lines in all, want the one of the loss that lasted:\n%s", n, logs.String())
			}
		})
	}
}

// TestLockTakenIsCalledAtEachRetake: a store's LockTaken hook is called once each time it takes
// its daemon lock again after losing it, and by the time the check that took it returns (a
// Ping's, or the watcher's it waited for), not at a check that finds the lock held. The
// daemon's hook tells the persistence actor (persistence.StoreRecovered), which wakes the
// sessions holding a turn result it refused: before, only a write taken woke them, and a
// cluster member's stopping session, which tries again once a second, came too late.
func TestLockTakenIsCalledAtEachRetake(t *testing.T) {
	for name, opts := range lockHolders() {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.NewDatabase(t)
			ctx := context.Background()
			var taken atomic.Int32
			opts.LockTaken = func() { taken.Add(1) }
			s, err := Open(ctx, dsn, opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			if err := s.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			if n := taken.Load(); n != 0 {
				t.Fatalf("LockTaken called %d times with the lock held all along, want 0", n)
			}
			for outage := int32(1); outage <= 2; outage++ {
				restore := pgtest.Cut(t, dsn)
				if err := s.Ping(ctx); err == nil {
					t.Fatal("Ping with the database cut = nil, want an error")
				}
				restore()
				pingUntilRetaken(t, s)
				if err := s.Ping(ctx); err != nil {
					t.Fatal(err)
				}
				if n := taken.Load(); n != outage {
					t.Errorf("after outage %d, LockTaken called %d times, want %d", outage, n, outage)
				}
			}
		})
	}
}

// lockHolders are the stores that hold the daemon lock, a single daemon's (exclusive) and a
// cluster member's (shared), by name, with the lock checked only when a test asks.
func lockHolders() map[string]Options {
	return map[string]Options{
		"exclusive": {Exclusive: true, LockCheckInterval: time.Hour},
		"shared":    {Shared: true, LockCheckInterval: time.Hour},
	}
}

// pingUntilRetaken pings s until it answers, which it does once it has taken its daemon lock
// again after the database's return.
func pingUntilRetaken(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the lock was not taken again within 30 s of the database's return")
		}
		time.Sleep(50 * time.Millisecond) // a real server: poll under a deadline
	}
}

// TestSingleStatementsRunAgainAfterALostAnswer: the store's single statements that are not
// settled by the server's record when their answer is lost (docs/ARCHITECTURE.md) are
// harmless when their caller runs them again, as it does after a failure: a claim run again
// by the member whose claim committed counts the previous owner's death once (its
// previous owner is then itself, alive) and raises the key's epoch once more, which fences
// nothing of the caller's; an EndRun run again (the next start's, from the data directory's
// clean-stop file) changes nothing more, and one that comes after another run began leaves
// that run's record alone.
func TestSingleStatementsRunAgainAfterALostAnswer(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	mustPendingSessions(t, s, "a")
	p := Member{ID: "p", Host: "10.0.0.1", Port: 6340, Node: "h1/r_p"}
	q := Member{ID: "q", Host: "10.0.0.2", Port: 6340, Node: "h2/r_q"}
	for _, m := range []Member{p, q} {
		if _, err := s.Heartbeat(ctx, "c1", m, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	mustClaim(t, s, "ka", q.Node)
	mustExpire(t, conn, q.ID)
	first := mustClaim(t, s, "ka", p.Node) // its answer lost: p claims again
	if first.Counted == nil || first.Counted.Attempts != 1 {
		t.Fatalf("the claim after q's death counted %s, want a-m1 at 1", counted(first))
	}
	again := mustClaim(t, s, "ka", p.Node)
	if again.Counted != nil || again.Previous != p.Node || again.Epoch != first.Epoch+1 {
		t.Errorf("the claim run again = epoch %d, previous %q, %s; want epoch %d, previous %q, nothing counted",
			again.Epoch, again.Previous, counted(again), first.Epoch+1, p.Node)
	}
	if n := mustAttempts(t, conn, "a", 1); n != 1 {
		t.Errorf("attempts of a/1 after the claim run again = %d, want 1 (q's death counted once)", n)
	}

	run := func() string {
		t.Helper()
		var r string
		if err := conn.QueryRow(ctx, `SELECT run FROM daemon_run`).Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if _, err := s.BeginRun(ctx, "r1", t0); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.EndRun(ctx, "r1"); err != nil || run() != "" {
			t.Errorf("EndRun(r1), time %d = %v, the run recorded %q; want nil and none", i+1, err, run())
		}
	}
	if _, err := s.BeginRun(ctx, "r2", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.EndRun(ctx, "r1"); err != nil || run() != "r2" {
		t.Errorf("EndRun(r1) run again once r2 began = %v, the run recorded %q; want nil and r2", err, run())
	}
}
