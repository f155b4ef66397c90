// A single member's join that ends without a member (one remote.Start in the process, none
// running beside it), so it runs under -race too, unlike cluster_test.go's.

package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"net"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/jackc/pgx/v5"
)

// TestClusterJoinThatEndsLeavesNothingRunning: a cluster join that fails (its registration in
// the members table runs out of member_ttl, or its cluster port is taken) or that a stop cuts
// (Options.Stop) tears down what protoactor's StartMember started before Start returns: the
// member's cluster port can be bound again at once, and no goroutine of protoactor's (its gRPC
// server, the gossip loop, an endpoint actor) runs on. Before, serve exited right after, but an in-process caller (a test, an
// embedder) kept the port bound and those goroutines for the life of the process.
func TestClusterJoinThatEndsLeavesNothingRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop bool // a stop cuts the join; else member_ttl ends it
		// Another process listens on the cluster port: protoactor's remote cannot listen,
		// and started nothing that could be shut down.
		taken bool
	}{
		{"failed", false, false},
		{"stopped", true, false},
		{"port taken", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			dsn, admin, _ := membersLocked(t)
			// The cluster port is one the kernel picked (the test binds it again after), not a
			// fixed one, which parallel runs of the tests would share. A port taken is held
			// from the pick on; a free one is let go just before the start binds it.
			var (
				taken net.Listener
				bind  string
				err   error
			)
			if tc.taken {
				if taken, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				defer taken.Close()
				bind = taken.Addr().String()
			} else {
				bind = freeAddr(t)
			}
			cfg := config.Default()
			cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
			cfg.Store.Driver, cfg.Store.DSN = "postgres", dsn // (clusterOn, which is built without -race)
			cfg.Cluster.Enabled, cfg.Cluster.Bind = true, bind
			cfg.Cluster.MemberTTL = time.Second // the join's bound
			if tc.stop {
				cfg.Cluster.MemberTTL = 30 * time.Second
			}
			base := protoactorGoroutines()
			var logs testutil.Buffer
			stop := make(chan struct{})
			started := make(chan error, 1)
			go func() {
				d, err := Start(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(), Stop: stop})
				if err == nil {
					err = errors.New("Start returned a daemon")
					_ = d.Stop(context.Background())
				}
				started <- err
			}()
			if tc.stop {
				waitUntil(t, func() bool {
					var n int
					err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
						AND relation = 'members'::regclass`).Scan(&n)
					return err == nil && n > 0
				})
				close(stop)
			}
			err = <-started
			switch {
			case tc.stop && !errors.Is(err, ErrStopped):
				t.Fatalf("Start = %v after a stop during its join, want ErrStopped:\n%s", err, logs.String())
			case tc.taken && (err == nil || !strings.Contains(err.Error(), "address already in use")):
				t.Fatalf("Start = %v on a taken cluster port, want its failure to listen:\n%s", err, logs.String())
			case !tc.stop && !tc.taken && (err == nil || !strings.Contains(err.Error(), "membership: register")):
				t.Fatalf("Start = %v with the members table held past member_ttl, want the registration's failure:\n%s", err, logs.String())
			}
			if tc.taken {
				taken.Close()
			}
			// At once: Start has returned, and what it started is down.
			l, err := net.Listen("tcp", bind)
			if err != nil {
				t.Fatalf("the member's cluster port after its join ended: %v (the join left its listener open)", err)
			}
			l.Close()
			// The goroutines of a gRPC server and an actor's mailbox end asynchronously, just
			// after what stopped them returned.
			var left []string
			deadline := time.Now().Add(5 * time.Second)
			for {
				if left = newGoroutines(base, protoactorGoroutines()); len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("protoactor goroutines still run after the join ended:\n%s", strings.Join(left, "\n\n"))
				}
				goruntime.Gosched()
				time.Sleep(20 * time.Millisecond) // a poll interval under a deadline
			}
		})
	}
}

// protoactorGoroutines returns the stacks of the goroutines that run protoactor's code or that
// it started, keyed by their functions (not their arguments or states), except its throttles'
// timers (actor/throttler.go: a throttled log's period, up to the gossip's 60 s), which hold
// nothing, end on their own and cannot be stopped.
func protoactorGoroutines() map[string][]string {
	out := map[string][]string{}
	for g := range strings.SplitSeq(testutil.Goroutines(), "\n\n") {
		if !strings.Contains(g, "asynkron/protoactor-go") || strings.Contains(g, "/actor/throttler.go:") {
			continue
		}
		var fns []string
		for line := range strings.SplitSeq(g, "\n") {
			if line != "" && !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "goroutine ") {
				if created, ok := strings.CutPrefix(line, "created by "); ok {
					line, _, _ = strings.Cut(created, " in goroutine ")
				} else if i := strings.LastIndexByte(line, '('); i > 0 {
					line = line[:i] // the arguments
				}
				fns = append(fns, line)
			}
		}
		key := strings.Join(fns, " <- ")
		out[key] = append(out[key], g)
	}
	return out
}

// newGoroutines returns the stacks in now whose functions are not in base, or more of them.
func newGoroutines(base, now map[string][]string) []string {
	var left []string
	for key, gs := range now {
		if n := len(base[key]); len(gs) > n {
			left = append(left, gs[n:]...)
		}
	}
	slices.Sort(left)
	return left
}

// membersLocked returns a new database, migrated, whose members table a transaction (tx, on
// admin) holds locked for writes until the test ends or rolls tx back: a member's registration
// waits (reads pass), so that only the cluster's join does.
func membersLocked(t *testing.T) (dsn string, admin *pgx.Conn, tx pgx.Tx) {
	t.Helper()
	ctx := t.Context()
	dsn = pgtest.NewDatabase(t)
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	admin, err = pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	tx, err = admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `LOCK TABLE members IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return dsn, admin, tx
}
