package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startMembers starts n daemons sharing one PostgreSQL database (Options.SharedStore).
func startMembers(t *testing.T, n int, agent agents.Agent) []*runtime {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	var rs []*runtime
	for range n {
		r := MustStartDaemon(t, agent, daemonOpts{shared: true, tweak: func(c *config.Config) {
			c.Store.Driver, c.Store.DSN = "postgres", dsn
		}})
		t.Cleanup(func() { r.stop(t) })
		rs = append(rs, r)
	}
	return rs
}

// historyAgent answers each message with the user messages it was shown before it.
func historyAgent(block func(text string)) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		var seen []string
		for _, m := range req.History {
			if m.Role == persistence.RoleUser {
				seen = append(seen, m.Text)
			}
		}
		text := req.Messages[len(req.Messages)-1].Text
		if block != nil {
			block(text)
		}
		return &agents.Response{Text: fmt.Sprintf("[%s] %s", strings.Join(seen, " "), text)}, nil
	})
}

// checkReplies fails the test unless the platform's replies, by the message ids they answer,
// are want.
func checkReplies(t *testing.T, who string, r *runtime, want map[string][]string) {
	t.Helper()
	if got := repliesByMessage(r.fake.Sent()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s replied %v, want %v", who, got, want)
	}
}

// waitConfirmed waits until every reply of key is marked delivered in the store r writes to: an
// activation on another member sends an unconfirmed reply again (at least once), which a test
// of who answered what must not take for a second answer.
func waitConfirmed(t *testing.T, r *runtime, key string) {
	t.Helper()
	waitUntil(t, func() bool {
		snap, err := r.d.store.LoadSession(t.Context(), key, 0, 0)
		return err == nil && len(snap.Unconfirmed) == 0
	})
}

// repliesByMessage maps the message ids a platform's replies answer to their texts.
func repliesByMessage(out []*platforms.Outbound) map[string][]string {
	got := map[string][]string{}
	for _, o := range out {
		for _, id := range o.InReplyTo {
			got[id] = append(got[id], o.Text)
		}
	}
	return got
}

// TestSharedStoreFencesTheOlderActivation: two daemons on one database each activate the same
// session key, as a cluster does for a moment when its membership changes. The newer
// activation claims the key and loads everything the older one wrote; the older one's next
// write is refused, so it never writes with its stale state (its seq would collide with the
// newer one's). The message it was given is handed to a fresh activation that claims the key
// again, and is answered knowing the whole conversation.
func TestSharedStoreFencesTheOlderActivation(t *testing.T) {
	rs := startMembers(t, 2, historyAgent(nil))
	a, b := rs[0], rs[1]

	ack := a.inject(t, dm, "m1", "one")
	a.waitSent(t, 1)
	// a's reply is delivered and marked so: b's activation would otherwise send it again (a
	// reply not yet confirmed is re-sent at activation, at least once). The same for b's reply
	// before a's next activation.
	waitConfirmed(t, a, ack.SessionKey)
	b.inject(t, dm, "m2", "two")
	b.waitSent(t, 1)
	waitConfirmed(t, b, ack.SessionKey)
	ack = a.inject(t, dm, "m3", "three") // a's session still thinks it owns the key
	if ack == nil || ack.Disposition != platforms.Started {
		t.Fatalf("m3 on the older activation: ack %+v, want it started by the next activation", ack)
	}
	a.waitSent(t, 2)

	checkReplies(t, "member a", a, map[string][]string{"m1": {"[] one"}, "m3": {"[one two] three"}})
	checkReplies(t, "member b (it must have loaded a's turn)", b, map[string][]string{"m2": {"[one] two"}})
	if n := testutil.ToFloat64(a.d.metrics.SessionsFenced); n != 1 {
		t.Errorf("member a: sessions_fenced_total = %v, want 1", n)
	}

	msgs, err := a.d.store.Transcript(t.Context(), ack.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for i, m := range msgs {
		if m.Seq != int64(i+1) {
			t.Errorf("row %d has seq %d: seqs must be 1, 2, 3… with no gap or reuse", i, m.Seq)
		}
		rows = append(rows, m.Role+":"+m.Content)
	}
	wantRows := "user:one assistant:[] one user:two assistant:[one] two user:three assistant:[one two] three"
	if got := strings.Join(rows, " "); got != wantRows {
		t.Errorf("transcript\n got %s\nwant %s", got, wantRows)
	}
	own, err := a.d.store.Ownership(t.Context(), ack.SessionKey)
	if err != nil {
		t.Fatal(err)
	}
	if own.Epoch != 3 || own.Owner != a.d.deps.Node {
		t.Errorf("ownership %+v, want epoch 3 held by member a (%s)", own, a.d.deps.Node)
	}
}

// TestSharedStoreFencedTurnIsAnsweredOnce: a turn runs on one daemon while another claims its
// key. The newer activation runs the message again (it is pending in the store); the older
// turn's result is refused, so it is never stored and never sent: the user gets one answer.
func TestSharedStoreFencedTurnIsAnsweredOnce(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var slowRuns atomic.Int32
	rs := startMembers(t, 2, historyAgent(func(text string) {
		if text == "slow" && slowRuns.Add(1) == 1 { // the first run only: member a's
			close(started)
			<-release
		}
	}))
	a, b := rs[0], rs[1]

	ack := a.inject(t, dm, "m1", "slow")
	<-started
	b.inject(t, dm, "m2", "next")
	b.waitSent(t, 2)
	waitConfirmed(t, b, ack.SessionKey) // or a's next activation sends b's replies again
	close(release)
	// a's session is fenced by its turn's result write and stops; a's next message starts a
	// fresh activation, which shows a's fenced turn left nothing behind.
	a.inject(t, dm, "m3", "last")
	a.waitSent(t, 1)

	checkReplies(t, "member b", b, map[string][]string{"m1": {"[] slow"}, "m2": {"[slow] next"}})
	checkReplies(t, "member a (its fenced turn must send nothing)", a, map[string][]string{"m3": {"[slow next] last"}})
	msgs, err := a.d.store.Transcript(t.Context(), ack.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, m := range msgs {
		rows = append(rows, m.Role+":"+m.Content)
	}
	// m2 was stored while m1 waited for its rerun: the transcript keeps arrival order.
	wantRows := "user:slow user:next assistant:[] slow assistant:[slow] next user:last assistant:[slow next] last"
	if got := strings.Join(rows, " "); got != wantRows {
		t.Errorf("transcript\n got %s\nwant %s", got, wantRows)
	}
}

// TestSharedStoreStaleIdleActivationRecovers: an idle activation on member a loaded the key
// before member b's activation claimed it, stored a message (acknowledged to its sender) and
// stopped before running it, as when a cluster's view of its members settles. a writes nothing,
// so no fenced write tells it its state is stale. The recovery that a's member sends for keys
// with work in the store (Recover, the cluster's sweep) must make a start the session again and
// answer the message knowing the whole conversation; a session that ignored it left the message
// unanswered until the chat's next one.
func TestSharedStoreStaleIdleActivationRecovers(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	onDSN := func(c *config.Config) { c.Store.Driver, c.Store.DSN = "postgres", dsn }
	a := MustStartDaemon(t, historyAgent(nil), daemonOpts{shared: true, tweak: onDSN})
	t.Cleanup(func() { a.stop(t) })
	started := make(chan struct{})
	blocked := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		close(started)
		<-ctx.Done() // until b stops: the message stays pending in the store
		return nil, ctx.Err()
	})
	b := MustStartDaemon(t, blocked, daemonOpts{shared: true, drain: 10 * time.Millisecond, tweak: onDSN})

	ack := a.inject(t, dm, "m1", "one")
	a.waitSent(t, 1)
	waitConfirmed(t, a, ack.SessionKey) // so no activation sends it again
	if got := b.inject(t, dm, "m2", "two"); got == nil || got.SessionKey != ack.SessionKey {
		t.Fatalf("m2 on member b: ack %+v", got)
	}
	<-started
	b.stop(t)
	snap, err := a.d.store.LoadSession(t.Context(), ack.SessionKey, 0, 0)
	if err != nil || len(snap.Pending) != 1 || snap.Pending[0].MessageID != "m2" {
		t.Fatalf("after member b stopped: pending %+v (err %v), want m2 alone", snap.Pending, err)
	}

	a.d.system.Root.Send(a.d.manager, &actors.Routed{Key: ack.SessionKey, Msg: &actors.Recover{}})
	a.waitSent(t, 2)
	checkReplies(t, "member a", a, map[string][]string{"m1": {"[] one"}, "m2": {"[one] two"}})
	own, err := a.d.store.Ownership(t.Context(), ack.SessionKey)
	if err != nil {
		t.Fatal(err)
	}
	if own.Epoch != 3 || own.Owner != a.d.deps.Node {
		t.Errorf("ownership %+v, want epoch 3 held by member a (%s)", own, a.d.deps.Node)
	}
}

// TestSharedStoreRefusesWhenTheStoreIsDown: a member of a shared store keeps no spool (a write
// spooled on its disk could be answered by no other member, and would be fenced when
// replayed), so while the database cannot be written a message is refused explicitly (HTTP
// 503), never kept locally or dropped silently; once it is back, the same message is taken.
func TestSharedStoreRefusesWhenTheStoreIsDown(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := MustStartDaemon(t, historyAgent(nil), daemonOpts{shared: true, tweak: func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
	}})
	defer r.stop(t)
	r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)

	restore := pgtest.Cut(t, dsn)
	_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: dm, MessageID: "m2", Text: "two"})
	if !errors.Is(err, platforms.ErrUnavailable) {
		t.Fatalf("Inject with the shared store down = %v, want platforms.ErrUnavailable (503)", err)
	}
	if _, err := os.Stat(filepath.Join(r.d.cfg.DataDir, "spool")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a member of a shared store has a spool directory (%v)", err)
	}
	restore()

	r.inject(t, dm, "m2", "two") // the sender tries again
	checkReplies(t, "the member", r, map[string][]string{"m1": {"[] one"}})
	r.waitSent(t, 2)
	checkReplies(t, "the member", r, map[string][]string{"m1": {"[] one"}, "m2": {"[one] two"}})
}

// TestSingleDaemonAndSharedStoreMembersExcludeEachOther: a single daemon is not started on the
// database of a shared store's (a cluster's) members, nor a member on a single daemon's: both
// would activate the same sessions and run their agents at once. Before, members held no lock
// on the database, so either start succeeded.
func TestSingleDaemonAndSharedStoreMembersExcludeEachOther(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	onDSN := func(c *config.Config) { c.Store.Driver, c.Store.DSN = "postgres", dsn }
	start := func(shared bool) (*Daemon, error) {
		cfg := config.Default()
		cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
		onDSN(cfg)
		return Start(t.Context(), cfg, slog.New(slog.DiscardHandler), Options{Agent: echo.New(), SharedStore: shared})
	}
	member := MustStartDaemon(t, echo.New(), daemonOpts{shared: true, tweak: onDSN})
	if d, err := start(false); err == nil {
		(&runtime{d: d}).stop(t)
		t.Error("a single daemon started on the database of a running member")
	} else if !errors.Is(err, persistence.ErrLocked) {
		t.Errorf("single daemon's Start next to a member = %v, want persistence.ErrLocked", err)
	}
	member.stop(t)

	single := MustStartDaemon(t, echo.New(), daemonOpts{tweak: onDSN})
	defer single.stop(t)
	if d, err := start(true); err == nil {
		(&runtime{d: d}).stop(t)
		t.Error("a member started on the database of a running single daemon")
	} else if !errors.Is(err, persistence.ErrLocked) {
		t.Errorf("member's Start next to a single daemon = %v, want persistence.ErrLocked", err)
	}
}
