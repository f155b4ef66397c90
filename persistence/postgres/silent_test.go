package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
)

// TestClaimOutlivesASilentTransaction: a member whose host dies (or is cut off by a network
// partition) in the middle of a commit leaves its transaction open on the server, holding the
// fence of every key it wrote, with nothing that tells the server the client is gone (no
// FIN or RST comes; TCP keepalive notices after about two hours). The server ends such a
// transaction once it has been idle for the store's Timeout, and the member that takes the
// key over claims it then. Before, the claim waited for the dead member's transaction until
// its own timeout, again at every try, and the key's sessions could not start anywhere for
// as long as the server kept that connection.
func TestClaimOutlivesASilentTransaction(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	open := func(timeout time.Duration) *Store {
		t.Helper()
		s, err := Open(ctx, dsn, Options{Timeout: timeout})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	dead, taker := open(2*time.Second), open(20*time.Second)
	claimed, err := dead.Claim(ctx, "k", "dead", time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The dead member's commit has passed the key's fence, and its client falls silent: the
	// server cannot tell a dead host from a slow one.
	tx, err := dead.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, fenceSQL, "k", claimed.Epoch); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	got, err := taker.Claim(ctx, "k", "taker", time.Now(), nil)
	if err != nil {
		t.Fatalf("claim after the holder's transaction fell silent (%v later): %v", time.Since(began).Round(time.Millisecond), err)
	}
	if got.Epoch != claimed.Epoch+1 {
		t.Errorf("claim epoch %d, want %d", got.Epoch, claimed.Epoch+1)
	}
	// The silent transaction commits nothing after the claim.
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		if err := tx.Commit(ctx); err == nil {
			t.Error("the silent transaction committed after the key was claimed")
		}
	}
	if errs := dead.Commit(ctx, [][]persistence.Op{{&persistence.Fence{Key: "k", Epoch: claimed.Epoch},
		&persistence.CreateSession{Session: newSession("s1", "k")}}}); !errors.Is(errs[0], persistence.ErrFenced) {
		t.Errorf("the old holder's next commit: %v, want ErrFenced", errs[0])
	}
}

// TestSilentLockHolderLosesTheLock: a daemon whose host died (or that a network partition cut
// off) sends no FIN or RST, and the server kept its daemon lock for as long as TCP keepalive
// takes to notice (about two hours by default): a daemon started in its place was refused as
// "another agentgate daemon uses this database" all that time. The server now ends the lock's
// session once its connection has been silent for three lock checks, and the new daemon
// starts; the old one, should it come back, finds its lock lost and its commits fenced.
func TestSilentLockHolderLosesTheLock(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	old, err := Open(ctx, dsn, Options{Exclusive: true, LockCheckInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	// The old daemon falls silent: its lock check (which pings the lock's connection) stops.
	old.lockMu.Lock()
	froze := true
	defer func() {
		if froze {
			old.lockMu.Unlock()
		}
	}()

	began := time.Now()
	successor, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 20 * time.Second})
	if err != nil {
		t.Fatalf("a daemon started %v after the lock's holder fell silent: %v", time.Since(began).Round(time.Millisecond), err)
	}
	defer successor.Close()

	froze = false
	old.lockMu.Unlock()
	errs := old.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("the old holder's commit after the successor took the lock: %v, want ErrUnavailable", errs[0])
	}
	if _, err := successor.Session(ctx, "s1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("the old holder's session row: %v, want none", err)
	}
}

// TestSilentServerIsLeftAtOnce: after a failover whose old primary fell silent (its host
// gone: no FIN, no RST), a call that got no answer within its deadline closes the pool's other
// connections too, and the next call reaches the new primary. Before, each of the pool's idle
// connections, all of them to the old server, made a call wait out its deadline in turn: a
// cluster member's renewals (member_ttl/3 each) failed one after another past member_ttl, and
// every member of the cluster stopped.
func TestSilentServerIsLeftAtOnce(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	if m, err := Open(ctx, dsn, Options{}); err != nil { // migrates, through no proxy
		t.Fatal(err)
	} else {
		_ = m.Close()
	}
	p := newSilencer(t, dsn)
	s, err := Open(ctx, p.dsn, Options{MaxConns: 4, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer p.close() // first: the old primary's connections end at last
	// Four connections in the pool, all to "the old primary".
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := s.pool.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := s.pool.Stat().IdleConns(); n != 4 {
		t.Fatalf("%d idle connections, want 4", n)
	}
	p.silence() // the old primary's host is gone; new connections reach the new one

	// A renewal as a member makes it: a third of member_ttl for each.
	renew := func() error {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := s.Heartbeat(rctx, "c1", Member{ID: "a", Host: "10.0.0.1", Port: 6340}, 6*time.Second)
		return err
	}
	if err := renew(); err == nil {
		t.Fatal("a renewal over a silent connection succeeded")
	}
	for i := range 3 {
		if err := renew(); err != nil {
			t.Fatalf("renewal %d after the first met the silent server: %v", i+2, err)
		}
	}
}

// silencer passes a test database's connections through a Unix socket of its own until
// silence, which makes the connections open then drop everything they carry, both ways, and
// never close, as a host that is gone does. Connections made later pass.
type silencer struct {
	dsn     string
	close   func()        // ends every connection and the listener; idempotent
	dropped chan struct{} // signalled when a silent connection drops what its client sent
	mu      sync.Mutex
	silent  []*atomic.Bool
}

func newSilencer(t *testing.T, dsn string) *silencer {
	t.Helper()
	p := &silencer{dropped: make(chan struct{}, 1)}
	p.dsn, p.close = relayConns(t, dsn, "pgsilent", func(c, up net.Conn) func(dst, src net.Conn, fromClient bool) {
		silent := new(atomic.Bool)
		p.mu.Lock()
		p.silent = append(p.silent, silent)
		p.mu.Unlock()
		pass := func(dst, src net.Conn, fromClient bool) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 && !silent.Load() {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				} else if n > 0 && fromClient {
					select {
					case p.dropped <- struct{}{}:
					default:
					}
				}
				if err != nil {
					if !silent.Load() {
						_ = dst.Close()
					}
					return
				}
			}
		}
		return pass
	})
	return p
}

// lockThroughSilencer lets go of s's daemon lock and takes it again on a connection through a
// silencer, the lock's connection alone: the caller closes the silencer before s, so that a
// check's ping ends before Close lets go of the lock.
func lockThroughSilencer(t *testing.T, s *Store, dsn string) *silencer {
	t.Helper()
	p := newSilencer(t, dsn)
	through, err := pgx.ParseConfig(p.dsn)
	if err != nil {
		p.close()
		t.Fatal(err)
	}
	s.lockMu.Lock()
	s.unlock()
	s.lockCfg.Host, s.lockCfg.Fallbacks = through.Host, nil
	s.lockMu.Unlock()
	if err := s.checkLock(context.Background()); err != nil {
		p.close()
		t.Fatalf("take the lock again through the silencer: %v", err)
	}
	return p
}

func (p *silencer) silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.silent {
		s.Store(true)
	}
}

// TestPingWhoseCallerGaveUpKeepsTheLock: a readiness probe pings the store, which checks the
// daemon lock's connection on the way; its client may give up meanwhile (a probe's timeout,
// while a slow lock check in progress holds the lock's mutex, or a client that hangs up). A
// live lock connection is not dead for that: the daemon keeps its lock, and a second daemon
// is refused. Before, the check took the failed ping for a dead connection and let the lock
// go (a single daemon's writes spooled, a member's refused, until the next check took it again),
// and another daemon could take it meanwhile.
func TestPingWhoseCallerGaveUpKeepsTheLock(t *testing.T) {
	s, dsn := openUnchecked(t)
	ctx := context.Background()
	defer s.Close()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_ = s.Ping(gone) // what it answers does not matter: its caller is gone
	if _, err := s.lockHeld(); err != nil {
		t.Errorf("the lock after a ping whose caller had gone: %v, want it held", err)
	}
	if other, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 100 * time.Millisecond}); !errors.Is(err, persistence.ErrLocked) {
		if err == nil {
			_ = other.Close()
		}
		t.Errorf("a second daemon after a ping whose caller had gone: %v, want ErrLocked", err)
	}
	if errs := s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k")}}}); errs[0] != nil {
		t.Errorf("a commit after a ping whose caller had gone: %v", errs[0])
	}
}

// TestPingAnswersWhileTheLockCheckWaits: /readyz gives the store's ping 0.8 s, within a
// probe's timeout, and the ping checks the daemon lock's connection on the way, which a server
// that does not answer (hung, behind a partition) leaves waiting for the check's whole bound
// (5 s by default, an hour here). The ping answers once its caller's context ends, the
// database unavailable, and a ping that comes meanwhile waits for the same check, not behind
// it. Before, each ping waited for its check to end, after the check in progress: with
// PostgreSQL stopped by SIGSTOP, a soak's /readyz took 5 s and more, past a probe's timeout.
func TestPingAnswersWhileTheLockCheckWaits(t *testing.T) {
	s, dsn := openUnchecked(t)
	ctx := context.Background()
	defer s.Close()
	p := lockThroughSilencer(t, s, dsn)
	defer p.close() // first: the check's ping ends before Close lets go of the lock

	p.silence()
	pctx, cancel := context.WithCancel(ctx)
	pinged := make(chan error, 1)
	go func() { pinged <- s.Ping(pctx) }()
	<-p.dropped // the ping's check of the lock has gone to a server that does not answer
	cancel()    // the probe's time is up
	gone, cancelGone := context.WithCancel(ctx)
	cancelGone()
	for i, ping := range []func() error{
		func() error { return <-pinged },
		func() error { return s.Ping(gone) }, // a probe while the first one's check waits
	} {
		answered := make(chan error, 1)
		go func() { answered <- ping() }()
		select {
		case err := <-answered:
			if !errors.Is(err, persistence.ErrUnavailable) {
				t.Errorf("ping %d while the lock's check got no answer: %v, want ErrUnavailable", i+1, err)
			}
		case <-time.After(10 * time.Second): // a fail-safe: the check would wait an hour
			p.close() // the check's connection ends: the ping goes on
			t.Fatalf("ping %d answered only once the lock's check ended: %v", i+1, <-answered)
		}
	}
	// Its caller gone, the check goes on: the lock stays held until the check finds it lost.
	if _, err := s.lockHeld(); err != nil {
		t.Errorf("the lock while its check waits: %v, want it held", err)
	}
}

// TestLockCheckBehindAnotherKeepsItsBound: a check of the daemon lock (a ping's, or the lock
// watcher's) that waits for the check in progress (lockMu) has its whole bound once it runs.
// Before, its bound ran out while it waited: behind a check that took most of its own (a
// server slow to answer, each round trip seconds long, or a retake's connection and four
// statements), it pinged the lock's live connection with little or no time left, took the
// ping that ran out for a dead connection and let the lock go (a single daemon's writes
// spooled, a member's refused, and another daemon free to take it) until the next retake.
func TestLockCheckBehindAnotherKeepsItsBound(t *testing.T) {
	s, _ := openUnchecked(t)
	defer s.Close()
	s.lockEvery = 250 * time.Millisecond // the checks' bound, before the store is shared
	held := s.held.Load()
	s.lockMu.Lock() // a check in progress
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Ping(gone)              // its caller gone at once; the check it started waits for the one in progress
	<-time.After(3 * s.lockEvery) // the check in progress outlasts the waiting one's bound
	s.lockMu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.probeMu.Lock()
		running := s.probe != nil
		s.probeMu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ping's check of the lock did not end")
		}
		time.Sleep(5 * time.Millisecond) // a real server: poll under a deadline
	}
	if got := s.held.Load(); got != held {
		t.Errorf("the lock after a check that waited for another: %+v, want it held as before (%+v): "+
			"the check's bound ran out while it waited, and it let go of the live lock", got, held)
	}
}

// TestCloseEndsALockRetakeTheServerDoesNotAnswer: a store whose lost daemon lock is being
// taken again (watchLock) over a network that drops everything (a partition: no RST) closes at
// once; the retake's connection is given up. Before, Close waited for it: up to the lock
// check's interval (5 s by default, an hour here), at the end of a daemon's stop in the
// outage, and a retake runs each second while the lock is lost.
func TestCloseEndsALockRetakeTheServerDoesNotAnswer(t *testing.T) {
	s, _ := openUnchecked(t)
	dir, dialled, hangUp := newHole(t, s.lockCfg.Port)
	defer hangUp()
	// The lock's connection is lost, and the server is now behind a partition.
	s.lockMu.Lock()
	s.unlock()
	s.lockLost = true
	s.lockCfg.Host, s.lockCfg.Fallbacks = dir, nil
	s.lockMu.Unlock()
	select {
	case <-dialled: // a retake waits for the server's answer
	case <-time.After(30 * time.Second):
		t.Fatal("no retake of the lost lock within 30 s")
	}

	closed := make(chan struct{})
	began := time.Now()
	go func() {
		_ = s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		hangUp() // the retake's connection ends: Close goes on
		t.Errorf("Close has not returned %v after it began, with a retake of the lock waiting for a partitioned server", time.Since(began).Round(time.Millisecond))
		<-closed
	}
}

// newHole listens, in a directory of its own, on the Unix socket of a database server on port,
// as a server behind a network partition (no RST) looks: connections are accepted and never
// answered, until hangUp, which closes them and the listener. dialled is signalled at each
// connection. hangUp is idempotent.
func newHole(t *testing.T, port uint16) (dir string, dialled <-chan struct{}, hangUp func()) {
	t.Helper()
	dir, err := os.MkdirTemp("", "pghole")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	hole, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", port)))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	dial := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case dial <- struct{}{}:
			default:
			}
		}
	})
	hangUp = func() {
		_ = hole.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	t.Cleanup(hangUp)
	return dir, dial, hangUp
}

// TestLockCheckHoldsNoCommit: the lock check pings the daemon lock's connection every 5 s, and
// a ping the server does not answer (a partition, a hung server) waits out the check's timeout
// (5 s). A commit meanwhile goes on, fenced with the epoch of the lock the store holds until
// the check finds it lost. Before, every commit (the persistence actor's whole batch, all
// chats) waited for the check in progress: a round trip at every check, the whole timeout here.
func TestLockCheckHoldsNoCommit(t *testing.T) {
	s, dsn := openUnchecked(t)
	ctx := context.Background()
	defer s.Close()
	p := lockThroughSilencer(t, s, dsn)
	defer p.close() // first: the check's ping ends before Close lets go of the lock

	p.silence()
	// Given up after 10 s, as the watcher's check is after its interval: without it, a commit
	// that waits for the check would wait for ever.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	checked := make(chan error, 1)
	go func() { checked <- s.checkLock(cctx) }()
	<-p.dropped // the check's ping has gone to a server that does not answer

	committed := make(chan []error, 1)
	go func() {
		committed <- s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k")}}})
	}()
	select {
	case errs := <-committed:
		if errs[0] != nil {
			t.Errorf("a commit during a check of the lock: %v", errs[0])
		}
	case err := <-checked:
		t.Fatalf("the lock check whose ping got no answer ended (%v) before a commit begun during it", err)
	}
	if _, err := s.Session(ctx, "s1"); err != nil {
		t.Errorf("the session committed during the check: %v", err)
	}

	// The lock's connection ends: the check finds the lock lost, and a commit is refused.
	p.close()
	if err := <-checked; err == nil {
		t.Error("the check of a lock whose connection ended: nil, want the lock lost")
	}
	errs := s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s2", "k")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("a commit after the lock was lost: %v, want ErrUnavailable", errs[0])
	}
}

// TestLockRetakeHoldsNoCommit: once the daemon lock is lost, it is taken again each second, on
// a new connection, which a server behind a partition (no RST) does not answer for the check's
// whole timeout (5 s). A commit meanwhile is refused at once as unavailable: a single daemon
// spools it, a member refuses it and its sessions hold the results. Before, every commit
// waited for the retake in progress, and then was refused all the same.
func TestLockRetakeHoldsNoCommit(t *testing.T) {
	s, _ := openUnchecked(t)
	ctx := context.Background()
	defer s.Close()
	dir, dialled, hangUp := newHole(t, s.lockCfg.Port)
	defer hangUp() // first: the retake ends before Close
	// The lock's connection is lost, and the server is now behind a partition.
	s.lockMu.Lock()
	s.unlock()
	s.lockLost = true
	s.lockCfg.Host, s.lockCfg.Fallbacks = dir, nil
	s.lockMu.Unlock()
	<-dialled // a retake (watchLock's, each second) waits for the server's answer, for an hour

	committed := make(chan []error, 1)
	go func() {
		committed <- s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k")}}})
	}()
	select {
	case errs := <-committed:
		if !errors.Is(errs[0], persistence.ErrUnavailable) {
			t.Errorf("a commit during a retake of the lost lock: %v, want ErrUnavailable", errs[0])
		}
	case <-time.After(10 * time.Second): // a fail-safe: the retake would wait an hour
		hangUp() // the retake's connection ends: the commit goes on
		t.Errorf("a commit waited for a retake of the lost lock: %v", (<-committed)[0])
	}
}

// openUnchecked opens an exclusive store on a fresh database, whose lock it checks only hourly
// (the test drives the checks), and returns it with the database's dsn.
func openUnchecked(t *testing.T) (*Store, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	s, err := Open(context.Background(), dsn, Options{Exclusive: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s, dsn
}
