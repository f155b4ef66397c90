package postgres

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestMembers: members renew their registration with Heartbeat and each gets the live list; a
// member that stops is listed as leaving until it leaves, and is gone at once then; one whose
// heartbeat is older than the ttl (by the database's clock) is not listed, and clusters do not
// see each other's members.
func TestMembers(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6340, Kinds: []string{"session"}}
	ids := func(ms []Member) string {
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%s@%s:%d%v", m.ID, m.Host, m.Port, m.Kinds))
		}
		return fmt.Sprint(out)
	}
	beat := func(cluster string, m Member) string {
		t.Helper()
		live, err := s.Heartbeat(ctx, cluster, m, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ids(live)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("first member sees %s", got)
	}
	if got, want := beat("c1", b), "[a@10.0.0.1:6340[session] b@10.0.0.2:6340[session]]"; got != want {
		t.Errorf("second member sees %s, want %s", got, want)
	}
	if got := beat("c2", Member{ID: "x", Host: "h", Port: 1}); got != "[x@h:1[]]" {
		t.Errorf("another cluster's member sees %s", got)
	}

	// b stops renewing: once its heartbeat is older than the ttl, a no longer lists it.
	conn := mustConn(t, dsn)
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("after b's heartbeat expired, a sees %s", got)
	}
	// A renewal brings it back (protoactor itself never readmits an id it saw leave).
	if got, want := beat("c1", b), "[a@10.0.0.1:6340[session] b@10.0.0.2:6340[session]]"; got != want {
		t.Errorf("b renewed: it sees %s, want %s", got, want)
	}
	// b stops: it renews as leaving, and is listed (as leaving) until it removes its row.
	b.Leaving = true
	beat("c1", b)
	live, err := s.Heartbeat(ctx, "c1", a, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || live[0].Leaving || !live[1].Leaving {
		t.Errorf("b leaving: a sees %+v, want a and b, b leaving", live)
	}
	// a withdraws (a member's last step): Members reads the others without registering it.
	if err := s.Leave(ctx, "c1", "a"); err != nil {
		t.Fatal(err)
	}
	read, err := s.Members(ctx, "c1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != 1 || read[0].ID != "b" || !read[0].Leaving {
		t.Errorf("Members after a withdrew = %+v, want b alone, leaving", read)
	}
	if read, err := s.Members(ctx, "c1", ttl); err != nil || len(read) != 1 {
		t.Errorf("Members read twice = %+v, %v: the first read registered someone", read, err)
	}
	beat("c1", a)
	if err := s.Leave(ctx, "c1", "b"); err != nil {
		t.Fatal(err)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("after b left, a sees %s", got)
	}
}

// TestMemberGoneByItsAddress: a member that registers the address of an older one, as a
// process restarted on its port does before the old registration expires, makes the older one
// gone at once: it is no longer listed.
func TestMemberGoneByItsAddress(t *testing.T) {
	s, _ := MustOpen(t)
	ctx := context.Background()
	const ttl = time.Minute
	old := Member{ID: "old", Host: "10.0.0.1", Port: 6340, Node: "h1/r_old"}
	other := Member{ID: "other", Host: "10.0.0.2", Port: 6340, Node: "h2/r_other"}
	for _, m := range []Member{old, other} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	restarted := Member{ID: "new", Host: "10.0.0.1", Port: 6340, Node: "h1/r_new"}
	live, err := s.Heartbeat(ctx, "c1", restarted, ttl)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range live {
		got = append(got, m.ID+"="+m.Node)
	}
	if want := "[other=h2/r_other new=h1/r_new]"; fmt.Sprint(got) != want {
		t.Errorf("after a member registered the old one's address: %v, want %s", got, want)
	}
}

// TestHeartbeatListsExpiredMembersKept: a renewal that names members to keep lists those whose
// registration expired by time, marked Expired, beside the live ones; not one that left (its row
// is gone), one a newer member on its address replaced, or one it did not name. Before, an
// expired member was simply missing, like one that left: after the database's clock stepped
// ahead, a member could not tell the others, which had not renewed since the step, from members
// that were gone.
func TestHeartbeatListsExpiredMembersKept(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340}
	for _, m := range []Member{a, {ID: "b", Host: "10.0.0.2", Port: 6340}, {ID: "c", Host: "10.0.0.3", Port: 6340},
		{ID: "d", Host: "10.0.0.4", Port: 6340}, {ID: "e", Host: "10.0.0.5", Port: 6340}} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Leave(ctx, "c1", "c"); err != nil {
		t.Fatal(err)
	}
	// The database's clock steps ahead by 6 s: every registration but the next renewal's looks
	// older than the ttl.
	if _, err := mustConn(t, dsn).Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds'`); err != nil {
		t.Fatal(err)
	}
	// A newer member registers d's address: d is gone for certain.
	if _, err := s.Heartbeat(ctx, "c1", Member{ID: "d2", Host: "10.0.0.4", Port: 6340}, ttl); err != nil {
		t.Fatal(err)
	}
	listed := func(keep ...string) string {
		t.Helper()
		live, err := s.Heartbeat(ctx, "c1", a, ttl, keep...)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range live {
			out = append(out, fmt.Sprintf("%s:%v", m.ID, m.Expired))
		}
		return fmt.Sprint(out)
	}
	if got, want := listed("b", "c", "d"), "[a:false b:true d2:false]"; got != want {
		t.Errorf("keeping b, c and d: %s, want %s", got, want)
	}
	if got, want := listed(), "[a:false d2:false]"; got != want {
		t.Errorf("keeping none: %s, want %s", got, want)
	}
}

// TestClaimCountsTheDeathOfTheMemberThatHeldTheKey: a claim that takes a key from a member
// gone without leaving (its registration expired, or a newer member registered its address)
// adds one attempt to the key's head pending message, in the claim, once; a claim from a live
// member, from one that left, or of a key with nothing pending counts nothing.
func TestClaimCountsTheDeathOfTheMemberThatHeldTheKey(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl = 5 * time.Second
	pending := func(sid string, seq int64) persistence.Op {
		return &persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: seq,
			Role: persistence.RoleUser, Content: "hi", Platform: "http", ChatID: "c", MessageID: fmt.Sprint(sid, "-m", seq),
			UserID: "u", Status: persistence.StatusPending, Active: true, CreatedAt: t0}}
	}
	route := func(key, sid string) persistence.Op {
		return &persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: sid, Generation: 1, UpdatedAt: t0}}
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("a", "ka")}, route("ka", "a"),
		pending("a", 1), pending("a", 2),
		&persistence.CreateSession{Session: newSession("b", "kb")}, route("kb", "b"))
	beat := func(m Member) {
		t.Helper()
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	kill := func(m Member) {
		t.Helper()
		mustExpire(t, conn, m.ID)
	}
	claim := func(key, owner string) persistence.Claimed { return mustClaim(t, s, key, owner) }
	attempts := func(seq int64) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT attempts FROM messages WHERE session_id = 'a' AND seq = $1`, seq).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	diff := func(what string, got, want persistence.Claimed) {
		t.Helper()
		text := func(c persistence.Claimed) string {
			if c.Counted == nil {
				return fmt.Sprintf("%+v", c)
			}
			return fmt.Sprintf("{Epoch:%d Previous:%s Counted:%+v}", c.Epoch, c.Previous, *c.Counted)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %s, want %s", what, text(got), text(want))
		}
	}
	p := Member{ID: "p", Host: "10.0.0.1", Port: 6340, Node: "h1/r_p"}
	q := Member{ID: "q", Host: "10.0.0.2", Port: 6340, Node: "h2/r_q"}
	beat(p)
	beat(q)

	diff("first claim", claim("ka", p.Node), persistence.Claimed{Epoch: 1})
	diff("claim from a live member", claim("ka", q.Node), persistence.Claimed{Epoch: 2, Previous: p.Node})
	kill(q)
	diff("claim from a member whose registration expired", claim("ka", p.Node), persistence.Claimed{Epoch: 3, Previous: q.Node,
		Counted: &persistence.CountedMessage{Key: "ka", SessionID: "a", MessageID: "a-m1", Attempts: 1}})
	if a1, a2 := attempts(1), attempts(2); a1 != 1 || a2 != 0 {
		t.Errorf("attempts of a's messages %d, %d; want 1, 0 (only the head counts)", a1, a2)
	}
	diff("claim from the member that claimed after the death", claim("ka", "h3/r_x"), persistence.Claimed{Epoch: 4, Previous: p.Node})

	// p holds the key and restarts on its port: the new process registers p's address.
	claim("ka", p.Node)
	restarted := Member{ID: "p2", Host: p.Host, Port: p.Port, Node: "h1/r_p2"}
	beat(restarted)
	if got := claim("ka", restarted.Node); got.Counted == nil || got.Counted.Attempts != 2 {
		t.Errorf("claim from a member whose address a newer member registered: %+v, want the head counted (2 attempts)", got)
	}
	// p2 leaves cleanly: what it hands on counts nothing.
	if err := s.Leave(ctx, "c1", restarted.ID); err != nil {
		t.Fatal(err)
	}
	claim("ka", restarted.Node)
	if got := claim("ka", "h3/r_x"); got.Counted != nil {
		t.Errorf("claim from a member that left: counted %+v, want nothing", got.Counted)
	}
	// A key with nothing pending: nothing to count.
	claim("kb", q.Node)
	if got := claim("kb", p.Node); got.Counted != nil {
		t.Errorf("claim of a key with nothing pending: counted %+v", got.Counted)
	}

	// Two members claim a dead member's key at once: its death counts once.
	for round := range 10 {
		dead := Member{ID: fmt.Sprint("d", round), Host: "10.0.1.1", Port: 7000 + round, Node: fmt.Sprint("h9/r_d", round)}
		beat(dead)
		claim("ka", dead.Node)
		kill(dead)
		before := attempts(1)
		var wg sync.WaitGroup
		var counted atomic.Int32
		for _, owner := range []string{"h1/r_x", "h2/r_y"} {
			wg.Go(func() {
				if c, err := s.Claim(ctx, "ka", owner, t0, nil); err != nil {
					t.Error(err)
				} else if c.Counted != nil {
					counted.Add(1)
				}
			})
		}
		wg.Wait()
		if n, after := counted.Load(), attempts(1); n != 1 || after != before+1 {
			t.Fatalf("round %d: two claims at once counted the death %d times (attempts %d → %d), want once", round, n, before, after)
		}
	}
}

// TestMemberHTTP: the HTTP addresses an admin command may ask are those of the live members
// that do not leave, by each one's own ttl, the most recently renewed first; a member gone (its
// registration expired, or its address taken by a newer member), one that registered none and
// another cluster's are not listed.
func TestMemberHTTP(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	beat := func(cluster string, m Member, ttl time.Duration) {
		t.Helper()
		if _, err := s.Heartbeat(ctx, cluster, m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	beat("c1", Member{ID: "expired", Host: "10.0.0.9", Port: 6340, HTTP: "10.0.0.9:8080"}, time.Second)
	beat("c1", Member{ID: "old", Host: "10.0.0.1", Port: 6340, HTTP: "10.0.0.1:8080"}, time.Hour)
	beat("c1", Member{ID: "a", Host: "10.0.0.2", Port: 6340, HTTP: "10.0.0.2:8080"}, time.Hour)
	beat("c1", Member{ID: "leaving", Host: "10.0.0.3", Port: 6340, HTTP: "10.0.0.3:8080", Leaving: true}, time.Hour)
	beat("c1", Member{ID: "quiet", Host: "10.0.0.4", Port: 6340}, time.Hour)
	beat("c2", Member{ID: "x", Host: "10.0.1.1", Port: 6340, HTTP: "10.0.1.1:8080"}, time.Hour)
	beat("c1", Member{ID: "new", Host: "10.0.0.1", Port: 6340, HTTP: "10.0.0.1:8081"}, time.Hour) // restarted on old's address
	if _, err := mustConn(t, dsn).Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '2 seconds' WHERE id = 'expired'`); err != nil {
		t.Fatal(err)
	}
	ms, err := s.MemberHTTP(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.ID+"="+m.HTTP)
	}
	if want := "[new=10.0.0.1:8081 a=10.0.0.2:8080]"; fmt.Sprint(got) != want {
		t.Errorf("MemberHTTP = %v, want %s", got, want)
	}
}

// TestHolders: the holder of a key is the live member whose node made the key's latest claim
// (of two live registrations of one node, the newer); a key never claimed, claimed by a name no
// member registers, by a member of another cluster or by one whose registration expired has
// none. Every key ever claimed has its latest claim read, with a holder or without one (the
// condition of the next claim of it: Claim's seen). One call answers for many keys, more than
// one query takes (holdersPerQuery), each key as a lookup of it alone would.
func TestHolders(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6341, Kinds: []string{"session"}, Node: "h2/r_b"}
	other := Member{ID: "o", Host: "10.0.0.3", Port: 6340, Node: "h3/r_o"}
	for _, m := range []Member{a, b} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Heartbeat(ctx, "c2", other, ttl); err != nil {
		t.Fatal(err)
	}
	holders := func(keys ...string) map[string]string {
		t.Helper()
		ms, err := s.Holders(ctx, "c1", keys, ttl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for k, h := range ms {
			if m := h.Member; m != nil {
				out[k] = fmt.Sprintf("%s@%s:%d%v", m.ID, m.Host, m.Port, m.Kinds)
			}
		}
		return out
	}
	claim := func(key, owner string) {
		t.Helper()
		if _, err := s.Claim(ctx, key, owner, time.Now(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := holders("k"); len(got) != 0 {
		t.Errorf("a key never claimed: holders %v, want none", got)
	}
	if got := holders(); len(got) != 0 {
		t.Errorf("no keys: holders %v, want none", got)
	}
	claim("k", a.Node)
	claim("k", b.Node)
	claim("ka", a.Node)
	claim("unknown", "h9/r_x")
	claim("elsewhere", other.Node)
	want := map[string]string{"k": "b@10.0.0.2:6341[session]", "ka": "a@10.0.0.1:6340[session]"}
	if got := holders("k", "ka", "unknown", "elsewhere", "never"); !reflect.DeepEqual(got, want) {
		t.Errorf("holders = %v, want %v (k claimed by a, then b; ka by a; none for the others)", got, want)
	}
	// Every key ever claimed has its latest claim read, with a live member or without one: the
	// condition of the next claim of it (Claim's seen).
	ms, err := s.Holders(ctx, "c1", []string{"k", "ka", "unknown", "elsewhere", "never"}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]persistence.ClaimSeen{}
	for k, h := range ms {
		seen[k] = h.ClaimSeen
	}
	if want := map[string]persistence.ClaimSeen{"k": {Epoch: 2, Owner: b.Node}, "ka": {Epoch: 1, Owner: a.Node},
		"unknown": {Epoch: 1, Owner: "h9/r_x"}, "elsewhere": {Epoch: 1, Owner: other.Node}}; !reflect.DeepEqual(seen, want) {
		t.Errorf("claims read = %v, want %v (none for a key never claimed)", seen, want)
	}

	// Many keys at once: more than one query's worth, every other one claimed, by a or by b.
	n := 2*holdersPerQuery + 7
	keys := make([]string, n)
	want = map[string]string{}
	for i := range keys {
		keys[i] = fmt.Sprintf("many-%d", i)
		switch i % 4 {
		case 0:
			claim(keys[i], a.Node)
			want[keys[i]] = "a@10.0.0.1:6340[session]"
		case 2:
			claim(keys[i], b.Node)
			want[keys[i]] = "b@10.0.0.2:6341[session]"
		}
	}
	if got := holders(keys...); !reflect.DeepEqual(got, want) {
		t.Errorf("holders of %d keys: %d named, want %d; first differences: %v", n, len(got), len(want), firstDiff(got, want, 3))
	}

	// a restarts on another port with the same node before its old registration expires: the
	// newer registration holds a's keys.
	a2 := Member{ID: "a2", Host: "10.0.0.1", Port: 6350, Kinds: []string{"session"}, Node: a.Node}
	if _, err := s.Heartbeat(ctx, "c1", a2, ttl); err != nil {
		t.Fatal(err)
	}
	if got := holders("ka")["ka"]; got != "a2@10.0.0.1:6350[session]" {
		t.Errorf("two live registrations of a's node: holder of ka %s, want the newer, a2", got)
	}

	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	if got := holders("k"); len(got) != 0 {
		t.Errorf("b's registration expired: holders %v, want none", got)
	}
}

// firstDiff returns up to n keys on which got and want differ, with both values.
func firstDiff(got, want map[string]string, n int) []string {
	var out []string
	for k := range want {
		if got[k] != want[k] && len(out) < n {
			out = append(out, fmt.Sprintf("%s: %q, want %q", k, got[k], want[k]))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && len(out) < n {
			out = append(out, fmt.Sprintf("%s: %q, want none", k, got[k]))
		}
	}
	return out
}

// TestMembersAreJudgedByTheirOwnTTL: members configured with different member_ttl (a rolling
// restart that changes it) each stay listed for their own ttl after a renewal, by every member's
// Heartbeat, Members and Holders, as a claim judges them; and a member gone by its own ttl is not
// listed by a member with a longer one. Before, each caller judged every member by its own ttl:
// a member renewing every 10 s (member_ttl 30 s) was gone for one with member_ttl 6 s between
// renewals, and protoactor's gossip of that member blocked it for ever.
func TestMembersAreJudgedByTheirOwnTTL(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const short, long = 6 * time.Second, 30 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6340, Node: "h2/r_b"}
	beat := func(m Member, ttl time.Duration) string {
		t.Helper()
		live, err := s.Heartbeat(ctx, "c1", m, ttl)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range live {
			ids = append(ids, l.ID)
		}
		return fmt.Sprint(ids)
	}
	age := func(id string, by time.Duration) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = clock_timestamp() - make_interval(secs => $1) WHERE id = $2`,
			by.Seconds(), id); err != nil {
			t.Fatal(err)
		}
	}
	beat(a, short)
	beat(b, long)
	if _, err := s.Claim(ctx, "k", b.Node, time.Now(), nil); err != nil {
		t.Fatal(err)
	}

	// b, between two renewals (every 10 s), is alive by its own ttl.
	age("b", 8*time.Second)
	if got := beat(a, short); got != "[a b]" {
		t.Errorf("b renewed 8 s ago with member_ttl 30 s: a (member_ttl 6 s) sees %s, want [a b]", got)
	}
	if live, err := s.Members(ctx, "c1", short); err != nil || len(live) != 2 {
		t.Errorf("Members with member_ttl 6 s = %+v, %v; want a and b", live, err)
	}
	if ms, err := s.Holders(ctx, "c1", []string{"k"}, short); err != nil || ms["k"].Member == nil || ms["k"].Member.ID != "b" {
		t.Errorf("Holders(k) with member_ttl 6 s = %+v, %v; want b, which claimed k and is alive", ms, err)
	}

	// a, 8 s after its last renewal, has counted itself gone (member_ttl 6 s): b does not list it.
	age("a", 8*time.Second)
	if got := beat(b, long); got != "[b]" {
		t.Errorf("a renewed 8 s ago with member_ttl 6 s: b (member_ttl 30 s) sees %s, want [b]", got)
	}

	// b past its own ttl is gone for everyone.
	age("b", 31*time.Second)
	if got := beat(a, short); got != "[a]" {
		t.Errorf("b renewed 31 s ago with member_ttl 30 s: a sees %s, want [a]", got)
	}
	if ms, err := s.Holders(ctx, "c1", []string{"k"}, long); err != nil || ms["k"].Member != nil {
		t.Errorf("Holders(k) after b's registration expired: %+v, %v; want none", ms, err)
	}
}

// TestStrangers: a member finds the live members of other clusters on its schema that
// registered before it, leaving ones too (their drain still runs turns); not those of its own
// cluster, nor younger or expired ones.
func TestStrangers(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl = 6 * time.Second
	beat := func(cluster string, m Member) {
		t.Helper()
		if _, err := s.Heartbeat(ctx, cluster, m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	strangers := func(cluster, id string) string {
		t.Helper()
		ms, err := s.Strangers(ctx, cluster, id, ttl)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Cluster+"/"+m.ID)
		}
		return fmt.Sprint(out)
	}
	beat("old", Member{ID: "o1", Host: "10.0.2.1", Port: 6340, Leaving: true})
	beat("prod", Member{ID: "p1", Host: "10.0.0.1", Port: 6340})
	beat("prod", Member{ID: "p2", Host: "10.0.0.2", Port: 6340})
	beat("staging", Member{ID: "s1", Host: "10.0.1.1", Port: 6340})
	for _, c := range []struct{ cluster, id, want string }{
		{"old", "o1", "[]"},
		{"prod", "p1", "[old/o1]"},
		{"prod", "p2", "[old/o1]"},
		{"staging", "s1", "[old/o1 prod/p1 prod/p2]"},
		{"prod", "unknown", "[]"},
	} {
		if got := strangers(c.cluster, c.id); got != c.want {
			t.Errorf("Strangers(%s, %s) = %s, want %s", c.cluster, c.id, got, c.want)
		}
	}
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '7 seconds' WHERE id = 'p1'`); err != nil {
		t.Fatal(err)
	}
	if got := strangers("staging", "s1"); got != "[old/o1 prod/p2]" {
		t.Errorf("p1 expired: Strangers(staging, s1) = %s, want [old/o1 prod/p2]", got)
	}
}

// TestClockReadsTheServersClock: Clock returns the database server's clock, which on this host
// is this process's (to the server's microseconds), and fails on a closed store.
func TestClockReadsTheServersClock(t *testing.T) {
	s, _ := MustOpen(t)
	before := time.Now()
	got, err := s.Clock(context.Background())
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
		t.Errorf("Clock: %v, want between %v and %v", got, before, after)
	}
	s.Close()
	if _, err := s.Clock(context.Background()); err == nil || !strings.Contains(err.Error(), "database's clock") {
		t.Errorf("Clock on a closed store: %v, want an error naming the clock", err)
	}
}
