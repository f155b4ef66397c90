package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/persistence/workload"
)

func TestIsUnavailable(t *testing.T) {
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})

	// SQLITE_BUSY: a second connection cannot take the write lock while the first holds it.
	ctx := context.Background()
	holder, err := MustRawDB(t, s.Path()).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	impatient, err := sql.Open("sqlite", dsn(s.Path(), "_pragma=busy_timeout(0)"))
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	_, busyErr := impatient.Exec("BEGIN IMMEDIATE")
	if _, err := holder.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// SQLITE_CONSTRAINT: a problem with the write itself.
	_, constraintErr := impatient.Exec(`INSERT INTO sessions (id, key) VALUES ('s1', 'k1')`)

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"busy", busyErr, true},
		{"wrapped busy", fmt.Errorf("commit: %w", busyErr), true},
		{"constraint", constraintErr, false},
		{"plain error", errors.New("boom"), false},
		{"duplicate", persistence.ErrDuplicate, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name != "nil" && tc.err == nil {
				t.Fatalf("setup produced no error")
			}
			if got := IsUnavailable(tc.err); got != tc.want {
				t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
			}
			// A read that fails so says "retry later" as the PostgreSQL store's reads do
			// (persistence.ErrUnavailable: the HTTP API's 503), and only then.
			if tc.err == nil {
				return
			}
			err := (&Store{log: logger(nil)}).readError("route %s: %w", "k1", tc.err)
			if got := errors.Is(err, persistence.ErrUnavailable); got != tc.want {
				t.Errorf("readError(%v) is ErrUnavailable = %v, want %v", tc.err, got, tc.want)
			}
			if !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), "persistence: database unavailable: route k1: ") && tc.want {
				t.Errorf("readError(%v) = %q, want it to wrap the error and name the read", tc.err, err)
			}
		})
	}
}

func TestCheckpoint(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{CheckpointInterval: time.Hour}) // only the explicit checkpoints below
	var auto int
	if err := s.writer.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto != 0 {
		t.Errorf("writer wal_autocheckpoint = %d, want 0 (checkpoints off the commit path)", auto)
	}
	ops := []persistence.Op{&persistence.CreateSession{Session: newSession("s1", "k1")}}
	for seq := int64(1); seq <= 200; seq++ {
		ops = append(ops, &persistence.AppendMessage{Message: userMsg("s1", seq, strings.Repeat("words ", 50))})
	}
	storetest.MustCommit(t, s, ops...)
	fi, err := os.Stat(s.Path() + "-wal")
	if err != nil || fi.Size() == 0 {
		t.Fatalf("WAL after a commit: %v, %v; want a non-empty file", fi, err)
	}
	for _, mode := range []string{"PASSIVE", "RESTART", "TRUNCATE"} {
		r, err := checkpoint(ctx, s.writer, s.dropWriter, mode)
		if err != nil || r.Busy {
			t.Errorf("checkpoint(%s) = %+v, %v, want not busy", mode, r, err)
		}
	}
	if fi, err := os.Stat(s.Path() + "-wal"); err != nil || fi.Size() != 0 {
		t.Errorf("WAL after TRUNCATE: size %v, err %v, want 0", fi.Size(), err)
	}
	// The writer's busy timeout is restored after RESTART/TRUNCATE.
	var busy int
	if err := s.writer.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 5000 {
		t.Errorf("writer busy_timeout after checkpoints = %d, %v, want 5000", busy, err)
	}
}

// TestDiskFullMidBatch: a group that fills the disk fails with an "unavailable" error, and what
// Commit reports for the other groups matches what is durable, whether SQLite kept the
// transaction (the group alone fails) or rolled it back (every group fails).
func TestDiskFullMidBatch(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	var pages int
	if err := s.writer.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.writer.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages+2)); err != nil {
		t.Fatal(err)
	}
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.SetTitle{SessionID: "s1", Title: "before"}},
		{&persistence.AppendMessage{Message: userMsg("s1", 1, strings.Repeat("x", 1<<20))}},
		{&persistence.TouchSession{SessionID: "s1", At: t0.Add(time.Hour)}},
	})
	if errs[1] == nil || !IsUnavailable(errs[1]) || !errors.Is(errs[1], persistence.ErrUnavailable) {
		t.Errorf("Commit of a row bigger than the disk: %v, want an error wrapping persistence.ErrUnavailable", errs[1])
	}
	ss, err := s.Session(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if got := ss.Title == "before"; got != (errs[0] == nil) {
		t.Errorf("group 0: reported %v, title committed %v", errs[0], got)
	}
	if got := ss.LastActivityAt.Equal(t0.Add(time.Hour)); got != (errs[2] == nil) {
		t.Errorf("group 2: reported %v, touch committed %v", errs[2], got)
	}
	if ms, _ := s.Transcript(ctx, "s1"); len(ms) != 0 {
		t.Errorf("Transcript has %d rows after the failed group, want 0", len(ms))
	}
}

// BenchmarkCommitTurns commits the turns of 100 sessions (persistence/workload: a user message
// and a reply of 300 bytes of Zipf-distributed words, the status, the activity, the route and
// the outbox entry; each turn its own group), batch turns per Commit: one b.Loop iteration is
// one Commit. It reports turns/s and cpu_us/turn, the process CPU time (user + system) per turn,
// which a shared machine disturbs much less than wall time. Both include indexing every
// committed message for Search: what still waits after the loop is indexed, and counted, before
// the figures are taken.
// countdownCtx reports itself cancelled from its n-th Err call on. Done never fires: a context
// that ends while a batch runs is seen by its Err, wherever the batch looks.
type countdownCtx struct {
	context.Context
	n int
}

func (c *countdownCtx) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// A context that ends during a batch, wherever in it, commits none of its groups and fails all
// of them; one that does not end commits them all.
func TestCommitCancelledMidBatch(t *testing.T) {
	const groups = 5
	cancelled := 0
	for n := 0; ; n++ {
		s := MustOpen(t, Options{})
		batch := make([][]persistence.Op, groups)
		for i := range batch {
			batch[i] = []persistence.Op{&persistence.CreateSession{Session: newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))}}
		}
		errs := s.Commit(&countdownCtx{Context: context.Background(), n: n}, batch)
		failed := 0
		for i, err := range errs {
			if err != nil {
				failed++
				if !errors.Is(err, context.Canceled) {
					t.Errorf("n=%d: group %d error = %v, want context.Canceled", n, i, err)
				}
			}
		}
		stored := 0
		for i := range groups {
			_, err := s.Session(context.Background(), fmt.Sprintf("s%d", i))
			switch {
			case err == nil:
				stored++
			case !errors.Is(err, persistence.ErrNotFound):
				t.Fatalf("n=%d: Session(s%d): %v", n, i, err)
			}
		}
		if failed == groups && stored == 0 {
			cancelled++
		} else if failed != 0 || stored != groups {
			t.Fatalf("n=%d: %d groups failed and %d were stored, want all or none", n, failed, stored)
		}
		if failed == 0 {
			break // the context was not looked at often enough to end the batch
		}
		if n > 100 {
			t.Fatal("a batch of 5 groups looked at its context more than 100 times")
		}
	}
	// The batch looks at its context before every group and before the commit.
	if cancelled < groups+1 {
		t.Errorf("the batch ended at %d points, want at least %d (every group and the commit)", cancelled, groups+1)
	}
}

func BenchmarkCommitTurns(b *testing.B) {
	const sessions = 100
	texts := workload.Texts(rand.New(rand.NewPCG(1, 2)), 4096)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, batch := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s := MustOpen(b, Options{})
			ss := make([]persistence.Session, sessions)
			var setup []persistence.Op
			for i := range ss {
				ss[i] = newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))
				setup = append(setup, &persistence.CreateSession{Session: ss[i]})
			}
			storetest.MustCommit(b, s, setup...)
			ctx := context.Background()
			groups := make([][]persistence.Op, batch)
			n := 0 // turns committed
			cpu0, start := cpuTime(b), time.Now()
			for b.Loop() {
				for i := range groups {
					groups[i] = workload.Turn(ss[n%sessions], n/sessions, texts[(2*n)%len(texts)],
						texts[(2*n+1)%len(texts)], base.Add(time.Duration(n)*time.Millisecond))
					n++
				}
				for i, err := range s.Commit(ctx, groups) {
					if err != nil {
						b.Fatalf("Commit group %d: %v", i, err)
					}
				}
			}
			MustIndex(b, s)
			elapsed, cpu := time.Since(start), cpuTime(b)-cpu0
			b.ReportMetric(float64(n)/elapsed.Seconds(), "turns/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu_us/turn")
		})
	}
}

// cpuTime returns the CPU time (user + system) the process has used so far.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestUnavailableGroupFailsTheBatch: a group the database cannot take (a fault injected into one
// of its ops, as a write error of the disk would be) fails the whole batch with ErrUnavailable.
// The persistence actor then spools the batch as it is, in order, so no later write of the same
// session commits ahead of the one that waits in the spool. (The savepoint retry used to commit
// every other group: here session a's third write, a status that the replay of its second
// would then have overtaken.)
func TestUnavailableGroupFailsTheBatch(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("a", "ka")},
		&persistence.CreateSession{Session: newSession("b", "kb")})
	s.fault = func(op persistence.Op) error {
		if m, ok := op.(*persistence.AppendMessage); ok && m.Message.SessionID == "a" && m.Message.Seq == 2 {
			return fmt.Errorf("disk I/O error (test): %w", driver.ErrBadConn)
		}
		return nil
	}
	groups := [][]persistence.Op{
		{&persistence.AppendMessage{Message: userMsg("a", 1, "one")}},
		{&persistence.AppendMessage{Message: userMsg("a", 2, "two")}},
		{&persistence.SetMessageStatus{SessionID: "a", Seqs: []int64{2}, Status: persistence.StatusDone},
			&persistence.AppendMessage{Message: userMsg("a", 3, "three")}},
		{&persistence.AppendMessage{Message: userMsg("b", 1, "other session")}},
	}
	errs := s.Commit(ctx, groups)
	for i := 1; i < len(groups); i++ {
		if !errors.Is(errs[i], persistence.ErrUnavailable) {
			t.Errorf("group %d: error = %v, want ErrUnavailable (it must not commit ahead of group 1)", i, errs[i])
		}
	}
	// Every group is atomic: stored exactly when it reported success.
	stored := map[string]bool{}
	for _, sid := range []string{"a", "b"} {
		tr, err := s.Transcript(ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tr {
			stored[fmt.Sprintf("%s/%d", m.SessionID, m.Seq)] = true
		}
	}
	for i, key := range []string{"a/1", "a/2", "a/3", "b/1"} {
		if stored[key] != (errs[i] == nil) {
			t.Errorf("message %s stored = %v, but its group's error is %v", key, stored[key], errs[i])
		}
	}
}

// TestUnavailableBatchKeepsRefusedGroupsErrors: when a group the database cannot take fails the
// batch, a group that the savepoint pass had already refused for what it holds (here a write
// fenced out by a newer claim of its key) keeps its own error. Before, the whole batch got the
// unavailable error, so the persistence actor spooled the refused group and acknowledged it as
// durable: the fenced-out session went on as the key's owner, and the replay set the batch aside.
func TestUnavailableBatchKeepsRefusedGroupsErrors(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("a", "ka")},
		&persistence.CreateSession{Session: newSession("b", "kb")})
	claimed, err := s.Claim(ctx, "ka", "first", time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	old := claimed.Epoch
	if _, err := s.Claim(ctx, "ka", "second", time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	s.fault = func(op persistence.Op) error {
		if m, ok := op.(*persistence.AppendMessage); ok && m.Message.SessionID == "b" {
			return fmt.Errorf("disk I/O error (test): %w", driver.ErrBadConn)
		}
		return nil
	}
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.Fence{Key: "ka", Epoch: old}, &persistence.AppendMessage{Message: userMsg("a", 1, "fenced")}},
		{&persistence.AppendMessage{Message: userMsg("b", 1, "waits in the spool")}},
	})
	if !errors.Is(errs[0], persistence.ErrFenced) || errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("the fenced group: error = %v, want ErrFenced (not ErrUnavailable: the actor would spool it and acknowledge it durable)", errs[0])
	}
	if !errors.Is(errs[1], persistence.ErrUnavailable) {
		t.Errorf("the group the database cannot take: error = %v, want ErrUnavailable", errs[1])
	}
}
