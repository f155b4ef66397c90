//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/jackc/pgx/v5"
)

// TestClusterRetriedDeliveryIsNotADuplicate: a message whose key a dead member held (its
// registration not yet expired) waits while the activation asks that member to let go, until
// its registration expires (deadMemberTTL); the cluster router's attempt times out meanwhile
// and it sends the message again. The first attempt stored the message, so the retry finds it stored: the
// sender is still told the message was taken, not that it was a duplicate, and it is answered
// once.
//
// Before, the retry's "duplicate" was the acknowledgment: the sender of a new message was told
// it had already been sent (TestClusterHunt found it after a member was stopped abruptly).
func TestClusterRetriedDeliveryIsNotADuplicate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := startClusterOn(t, dsn, 1, okAgent, 0, func(c *config.Config) { c.Cluster.MemberTTL = time.Minute })[0]
	defer a.stop(t)
	src, key, deadNode := chatOfADeadMember(t, a)
	if _, err := a.d.store.Claim(t.Context(), key, deadNode, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	ack := a.inject(t, src, "m1", "hi")
	if ack != nil && ack.Disposition != platforms.Started && ack.Disposition != platforms.Queued {
		t.Errorf("the message's only delivery was acknowledged %q, want it taken (%q or %q)", ack.Disposition, platforms.Started, platforms.Queued)
	}
	waitReply(t, []*runtime{a}, "m1")
	if n := repliesTo([]*runtime{a}, "m1"); n != 1 {
		t.Errorf("m1 answered %d times, want once", n)
	}
}

// TestClusterDeliveryStoppedAfterItsCommitIsNotADuplicate: a member stops past its drain while
// a session's write of a new message has committed but not yet answered; the session answers
// the message "stopped" (it may or may not be stored), and the cluster router sends it again to
// the key's next owner, which finds it stored. The sender is told the message was taken, not
// that it was a duplicate, and it is answered once.
//
// Before, the retry's "duplicate" was the acknowledgment (TestClusterHunt found it as members
// left while messages arrived).
func TestClusterDeliveryStoppedAfterItsCommitIsNotADuplicate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	held := holdCommitOf(func(op persistence.Op) bool {
		m, ok := op.(*persistence.AppendMessage)
		return ok && m.Message.MessageID == "x"
	})
	a, b, src := startMembersHeld(t, dsn, held)
	defer a.stop(t)
	acked := make(chan *platforms.Ack, 1)
	go func() { acked <- a.inject(t, src, "x", "hi") }()
	<-held.committed // stored, its answer held
	stopWhileHeld(t, dsn, b, held)
	if ack := <-acked; ack != nil && ack.Disposition != platforms.Started && ack.Disposition != platforms.Queued {
		t.Errorf("the message's only delivery was acknowledged %q, want it taken (%q or %q)", ack.Disposition, platforms.Started, platforms.Queued)
	}
	waitReply(t, []*runtime{a, b}, "x")
	if n := repliesTo([]*runtime{a, b}, "x"); n != 1 {
		t.Errorf("x answered %d times, want once", n)
	}
}

// holdCommit is a store whose commit of a group holding an op that match picks returns only
// once release is closed, after it has committed (committed is closed then).
type holdCommit struct {
	persistence.Store
	match     func(persistence.Op) bool
	committed chan struct{}
	release   chan struct{}
	once      sync.Once // committed
	letOnce   sync.Once // release
}

func holdCommitOf(match func(persistence.Op) bool) *holdCommit {
	return &holdCommit{match: match, committed: make(chan struct{}), release: make(chan struct{})}
}

func (s *holdCommit) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	errs := s.Store.Commit(ctx, groups)
	for _, g := range groups {
		if slices.ContainsFunc(g, s.match) {
			s.once.Do(func() { close(s.committed) })
			<-s.release
		}
	}
	return errs
}

// letGo releases the held commit (once).
func (s *holdCommit) letGo() { s.letOnce.Do(func() { close(s.release) }) }

// startMembersHeld starts two members on dsn, b with its commits through held, and returns them
// with a chat whose key b owns.
func startMembersHeld(t *testing.T, dsn string, held *holdCommit) (a, b *runtime, src identity.Source) {
	t.Helper()
	a = startClusterMember(t, dsn, okAgent, 5*time.Second)
	t.Cleanup(held.letGo)
	b = MustStartDaemon(t, okAgent, daemonOpts{drain: 100 * time.Millisecond, tweak: clusterOn(dsn),
		wrap: func(s persistence.Store) persistence.Store { held.Store = s; return held }})
	waitUntil(t, func() bool {
		return len(a.d.cluster.MemberList.Members().Members()) == 2 && len(b.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	i := 0
	for owner(a.d.intake.Key(chat(i))) != b.d.system.Address() {
		i++
	}
	return a, b, chat(i)
}

// stopWhileHeld stops b while its held commit waits: b's sessions stop, answering what waits
// for their writes "stopped", once it has withdrawn its registration (before its persistence
// actor stops, which waits for the held commit); then the commit returns, and b stops.
func stopWhileHeld(t *testing.T, dsn string, b *runtime, held *holdCommit) {
	t.Helper()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		b.stop(t)
	}()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitUntil(t, func() bool {
		var n int
		if err := conn.QueryRow(t.Context(), `SELECT COUNT(*) FROM members WHERE id = $1`, b.d.system.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	held.letGo()
	<-stopped
}

// TestClusterRetriedResetResetsOnce: an operator resets a chat whose key a dead member held
// (its registration not yet expired): the activation waits while it asks that member to let
// go, until its registration expires (deadMemberTTL), the cluster router's attempt times out
// meanwhile, and it sends the reset again. The
// first attempt reset the session, so the retry finds the session that reset began, empty,
// and answers with it: the chat's sessions are the one reset and the one the reset began.
//
// Before, the retry reset the new session too: an empty session ended for nothing (and a
// conversation begun in it meanwhile would have been ended with it).
func TestClusterRetriedResetResetsOnce(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := startClusterOn(t, dsn, 1, okAgent, 0, func(c *config.Config) { c.Cluster.MemberTTL = time.Minute })[0]
	defer a.stop(t)
	src, key, deadNode := chatOfADeadMember(t, a)
	// The chat's session, written by the dead member, which still holds the key.
	now := time.Now()
	old := persistence.Session{ID: "20260101_000000_0000dead", Key: key, Platform: src.Platform, ChatType: src.ChatType,
		ChatID: src.ChatID, UserID: src.UserID, StartedAt: now, LastActivityAt: now}
	if errs := a.d.store.Commit(t.Context(), [][]persistence.Op{{&persistence.CreateSession{Session: old},
		// Something was said in it: a reset leaves a session nothing was said in as it is.
		&persistence.AppendMessage{Message: persistence.Message{SessionID: old.ID, Seq: 1, Role: persistence.RoleUser,
			Content: "hi", Platform: src.Platform, ChatID: src.ChatID, MessageID: "m0", UserID: src.UserID,
			Status: persistence.StatusDone, Active: true, CreatedAt: now}},
		&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: old.ID, Generation: 1, UpdatedAt: now}}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, err := a.d.store.Claim(t.Context(), key, deadNode, now, nil); err != nil {
		t.Fatal(err)
	}
	got, err := (&sessionsAPI{d: a.d}).Reset(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if got.PrevSessionID != old.ID {
		t.Errorf("the reset answered with session %s following %q, want the one following %s", got.SessionID, got.PrevSessionID, old.ID)
	}
	ss, err := a.d.store.SessionsOfKey(t.Context(), key, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 {
		t.Errorf("the chat has %d sessions after one reset, want 2 (the one reset, the one it began): %+v", len(ss), ss)
	}
}

// deadMemberTTL is the member_ttl of chatOfADeadMember's member: an activation waits for a
// member that holds the key and cannot answer until its registration expires, here past the
// cluster router's attempt (clusterAttemptTimeout, 10 s) and well within its request
// (DefaultRequestTimeout, 30 s).
const deadMemberTTL = 12 * time.Second

// chatOfADeadMember registers a member that died a moment ago (live by its ttl, deadMemberTTL;
// its port closed) beside a, and returns a chat whose key a owns, the key and the dead member's
// node for a claim.
func chatOfADeadMember(t *testing.T, a *runtime) (src identity.Source, key, deadNode string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dead := postgres.Member{ID: "dead", Host: "127.0.0.1", Port: port, Kinds: []string{actors.SessionKind}, Node: "vm/r_dead"}
	if _, err := a.d.members.Heartbeat(t.Context(), a.d.cfg.Cluster.Name, dead, deadMemberTTL); err != nil {
		t.Fatal(err)
	}
	host, aPort, err := a.d.system.GetHostPort()
	if err != nil {
		t.Fatal(err)
	}
	owner := ownerOf([]*cluster.Member{{Id: a.d.system.ID, Host: host, Port: int32(aPort), Kinds: dead.Kinds},
		{Id: dead.ID, Host: dead.Host, Port: int32(dead.Port), Kinds: dead.Kinds}})
	i := 0
	for owner(a.d.intake.Key(chat(i))) != a.d.system.Address() {
		i++
	}
	return chat(i), a.d.intake.Key(chat(i)), dead.Node
}

// TestClusterResetStoppedAfterItsCommitResetsOnce: an operator's reset reaches the key's owner,
// which stores it, but the member leaves before the write's answer comes back: its session
// answers "stopped" (the reset may have taken effect). The cluster router sends the reset
// again, marked as a retry, to the key's next owner, which finds the session the reset began
// and answers with it: the reset is done, once. Before, the operator was told it may have
// taken effect, and to look before resetting again.
func TestClusterResetStoppedAfterItsCommitResetsOnce(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	held := holdCommitOf(func(op persistence.Op) bool { _, ok := op.(*persistence.EndSession); return ok })
	a, b, src := startMembersHeld(t, dsn, held)
	defer a.stop(t)
	first := a.inject(t, src, "x", "hi")
	waitReply(t, []*runtime{a, b}, "x")
	key := first.SessionKey
	reset := make(chan any, 1)
	go func() {
		res, err := a.d.router.Request(t.Context(), key, &actors.ResetSession{Reason: persistence.EndResetCommand})
		if err != nil {
			res = err
		}
		reset <- res
	}()
	<-held.committed // stored, its answer held
	stopWhileHeld(t, dsn, b, held)
	got := <-reset
	r, ok := got.(*actors.ResetResult)
	if !ok || r.Error != "" || r.PreviousSessionId != first.SessionID || r.SessionId == "" {
		t.Fatalf("the reset answered %+v, want it done: the session following %s", got, first.SessionID)
	}
	ss, err := a.d.store.SessionsOfKey(t.Context(), key, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 {
		t.Errorf("the chat has %d sessions after one reset, want 2 (the one reset, the one it began): %+v", len(ss), ss)
	}
	if route, err := a.d.store.Route(t.Context(), key); err != nil || route.SessionID != r.SessionId {
		t.Errorf("the key routes to %+v (%v), want the session the reset began, %s", route, err, r.SessionId)
	}
}
