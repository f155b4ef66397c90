package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TestPromiseNamesTheAskerAsTheHolder: member a asks for key k, whose latest claim is b's, through
// the store (ExchangeAsks); b's exchange finds the ask, with the claim's epoch, and no other
// member's does. b promises its claim to a: Holders names a from then on, the epoch stays (b's
// writes were fenced by it, a's claim raises it), and b is asked nothing more. A promise run again
// changes nothing and still says so; one of an epoch that is not the claim's, or by a member whose
// claim it is not, does nothing. A claim on b's claim is refused after the promise (the claim's
// owner is a), and a's claim on the claim Holders reads goes through and counts no death
// (previous is empty: nobody ran the key under the promised claim), and b's promise of the claim
// before it does nothing. Before, the store had no way to hand a claim over: Holders named b for as long as its
// registration lived, and a, which could not reach b, waited that long.
func TestPromiseNamesTheAskerAsTheHolder(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl, within = 5 * time.Second, 15 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6341, Kinds: []string{"session"}, Node: "h2/r_b"}
	c := Member{ID: "c", Host: "10.0.0.3", Port: 6342, Kinds: []string{"session"}, Node: "h3/r_c"}
	for _, m := range []Member{a, b, c} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	holder := func(key string) string {
		t.Helper()
		ms, err := s.Holders(ctx, "c1", []string{key}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if m := ms[key].Member; m != nil {
			return m.ID
		}
		return ""
	}
	exchange := func(m Member, keys ...string) []string {
		t.Helper()
		asks, err := s.ExchangeAsks(ctx, "c1", m.Node, keys, within, ttl)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range asks {
			out = append(out, fmt.Sprintf("%s@%d by %s (%s:%d %s)", a.Key, a.Epoch, a.Asker.ID, a.Asker.Host, a.Asker.Port, a.Asker.Node))
		}
		return out
	}
	promise := func(key string, epoch int64, from, to Member) bool {
		t.Helper()
		ok, err := s.Promise(ctx, key, epoch, from.Node, to.Node, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	claimed, err := s.Claim(ctx, "k", b.Node, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := holder("k"); got != "b" {
		t.Fatalf("holder of k after b's claim = %q, want b", got)
	}

	if got := exchange(a, "k"); len(got) != 0 {
		t.Errorf("a's exchange, asking for k: asks to a %v, want none", got)
	}
	want := fmt.Sprintf("k@%d by a (10.0.0.1:6340 h1/r_a)", claimed.Epoch)
	if got := exchange(b); fmt.Sprint(got) != "["+want+"]" {
		t.Errorf("b's exchange: %v, want [%s]", got, want)
	}
	if got := exchange(c); len(got) != 0 {
		t.Errorf("c's exchange: %v, want none (k's claim is not c's)", got)
	}

	if promise("k", claimed.Epoch, c, a) {
		t.Error("c promised b's claim of k, want nothing done")
	}
	if promise("k", claimed.Epoch+1, b, a) {
		t.Error("b promised k at an epoch that is not its claim's, want nothing done")
	}
	if got := holder("k"); got != "b" {
		t.Fatalf("holder of k after promises that did nothing = %q, want b", got)
	}
	if !promise("k", claimed.Epoch, b, a) {
		t.Fatal("b's promise of its claim of k to a did nothing")
	}
	if got := holder("k"); got != "a" {
		t.Errorf("holder of k after b promised it to a = %q, want a", got)
	}
	if own, err := s.Ownership(ctx, "k"); err != nil || own.Owner != a.Node || own.Epoch != claimed.Epoch {
		t.Errorf("ownership of k after the promise = %+v, %v; want a's node at epoch %d", own, err, claimed.Epoch)
	}
	if !promise("k", claimed.Epoch, b, a) {
		t.Error("b's promise run again says it did nothing, want promised (as the first did)")
	}
	if got := exchange(b); len(got) != 0 {
		t.Errorf("b's exchange after its promise: %v, want none (k's claim is a's)", got)
	}

	// A claim on b's claim (a third member that looked it up before the promise) is refused; the
	// claim Holders reads is a's, and a claims on it.
	if _, err := s.Claim(ctx, "k", c.Node, time.Now(), &persistence.ClaimSeen{Epoch: claimed.Epoch, Owner: b.Node}); !errors.Is(err, persistence.ErrClaimChanged) {
		t.Errorf("c's claim of k on b's claim after b promised it to a: %v, want ErrClaimChanged", err)
	}
	hs, err := s.Holders(ctx, "c1", []string{"k"}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	seen := hs["k"].ClaimSeen
	if want := (persistence.ClaimSeen{Epoch: claimed.Epoch, Owner: a.Node}); seen != want {
		t.Errorf("the claim of k Holders reads after the promise: %+v, want %+v", seen, want)
	}
	again, err := s.Claim(ctx, "k", a.Node, time.Now(), &seen)
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch != claimed.Epoch+1 || again.Previous != "" || again.Counted != nil {
		t.Errorf("a's claim after the promise = %+v, want epoch %d, no previous owner and nothing counted", again, claimed.Epoch+1)
	}
	if promise("k", claimed.Epoch, b, a) {
		t.Error("b's promise of its earlier claim after a claimed k did something, want nothing")
	}
	if got := holder("k"); got != "a" {
		t.Errorf("holder of k after a's claim = %q, want a", got)
	}
	// a promises on (to c), and a's claim of k at the epoch is c's.
	if _, err := s.ExchangeAsks(ctx, "c1", c.Node, []string{"k"}, within, ttl); err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("k@%d by c (10.0.0.3:6342 h3/r_c)", again.Epoch)
	if got := exchange(a); fmt.Sprint(got) != "["+want+"]" {
		t.Errorf("a's exchange once it claimed k: %v, want [%s]", got, want)
	}
	if !promise("k", again.Epoch, a, c) || holder("k") != "c" {
		t.Errorf("a's promise of k to c: holder %q, want c", holder("k"))
	}
	var previous string
	if err := conn.QueryRow(ctx, `SELECT previous FROM owners WHERE key = 'k'`).Scan(&previous); err != nil {
		t.Fatal(err)
	}
	if previous != "" {
		t.Errorf("previous owner of k after a's claim of a promised claim = %q, want none", previous)
	}
}

// TestExchangeAsksReplacesAndForgets: a member's exchange replaces its asks (a key it no longer
// asks for is not listed to its holder); an ask not renewed within the exchange's bound, or made
// by a member whose registration expired, is not listed; an ask for a key whose claim is the
// asker's own is not listed to it; asks of another cluster are not listed; and an ask nobody
// renewed for a day (its asker died) is removed by the next exchange in its cluster.
func TestExchangeAsksReplacesAndForgets(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl, within = 5 * time.Second, 15 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6341, Node: "h2/r_b"}
	x := Member{ID: "x", Host: "10.0.1.1", Port: 6340, Node: "h9/r_x"}
	for _, m := range []Member{a, b} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Heartbeat(ctx, "c2", x, ttl); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k2", "k3"} {
		if _, err := s.Claim(ctx, k, b.Node, time.Now(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, "mine", a.Node, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	asked := func(m Member, cluster string, keys ...string) []string {
		t.Helper()
		asks, err := s.ExchangeAsks(ctx, cluster, m.Node, keys, within, ttl)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range asks {
			out = append(out, a.Key+" by "+a.Asker.ID)
		}
		return out
	}
	asked(a, "c1", "k1", "k2", "mine")
	asked(x, "c2", "k3")
	if got, want := fmt.Sprint(asked(b, "c1")), "[k1 by a k2 by a]"; got != want {
		t.Errorf("asks to b = %s, want %s", got, want)
	}
	if got := asked(a, "c1", "k2"); len(got) != 0 {
		t.Errorf("asks to a = %v, want none (its ask for mine is its own)", got)
	}
	if got, want := fmt.Sprint(asked(b, "c1")), "[k2 by a]"; got != want {
		t.Errorf("asks to b once a asks for k2 only = %s, want %s", got, want)
	}
	if _, err := conn.Exec(ctx, `UPDATE release_asks SET asked_at = asked_at - interval '16 seconds' WHERE asker = $1`, a.Node); err != nil {
		t.Fatal(err)
	}
	if got := asked(b, "c1"); len(got) != 0 {
		t.Errorf("asks to b once a's were not renewed for 16 s = %v, want none", got)
	}
	asked(a, "c1", "k2") // renewed
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if got := asked(b, "c1"); len(got) != 0 {
		t.Errorf("asks to b once a's registration expired = %v, want none", got)
	}
	if _, err := conn.Exec(ctx, `UPDATE release_asks SET asked_at = asked_at - interval '25 hours' WHERE asker = $1`, x.Node); err != nil {
		t.Fatal(err)
	}
	asked(b, "c2") // another member's exchange in c2 removes x's day-old ask (x died)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM release_asks WHERE cluster = 'c2'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("asks left in c2 = %d (%v), want none", n, err)
	}
}

// TestPromiseWaitsForALiveMemberOfAnOlderVersion: a member of a version whose claims carry no
// condition registers no ClaimsOnCondition among its kinds (its own heartbeat's row, written
// here as it writes it). While it is live, in the cluster or in another on the schema, a
// promise promises nothing and Holders still names the promiser: as a third member that took
// the promiser's word over the link, it would claim the key beside the asker. Once it left, or
// its registration expired, the promise goes through (and, run again while such a member is
// back, still counts as promised: it stands). This version's registration carries the
// mark, which the kinds read back leave out. Before, the promise went through beside it.
func TestPromiseWaitsForALiveMemberOfAnOlderVersion(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	conn := mustConn(t, dsn)
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6341, Kinds: []string{"session"}, Node: "h2/r_b"}
	for _, m := range []Member{a, b} {
		live, err := s.Heartbeat(ctx, "c1", m, ttl)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range live {
			if fmt.Sprint(l.Kinds) != "[session]" {
				t.Errorf("kinds of %s read back = %v, want [session] (the mark left out)", l.ID, l.Kinds)
			}
		}
	}
	var kinds []string
	if err := conn.QueryRow(ctx, `SELECT kinds FROM members WHERE id = 'a'`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(kinds) != "[session "+ClaimsOnCondition+"]" {
		t.Errorf("kinds a registered = %v, want [session %s]", kinds, ClaimsOnCondition)
	}
	older := func(cluster string) {
		t.Helper()
		if _, err := conn.Exec(ctx, heartbeatSQL, cluster, "o", "10.0.0.9", 6349, []string{"session"}, false, "h9/r_o", ttl.Seconds(), ""); err != nil {
			t.Fatal(err)
		}
	}
	holder := func(key string) string {
		t.Helper()
		ms, err := s.Holders(ctx, "c1", []string{key}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if m := ms[key].Member; m != nil {
			return m.ID
		}
		return ""
	}
	promise := func(key string, epoch int64) bool {
		t.Helper()
		ok, err := s.Promise(ctx, key, epoch, b.Node, a.Node, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	claim := func(key string) int64 {
		t.Helper()
		c, err := s.Claim(ctx, key, b.Node, time.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Epoch
	}

	// In the cluster; then it leaves.
	e1 := claim("k1")
	older("c1")
	if promise("k1", e1) || holder("k1") != "b" {
		t.Errorf("b's promise of k1 while a member of an older version is live: holder %q, want b and nothing promised", holder("k1"))
	}
	if err := s.Leave(ctx, "c1", "o"); err != nil {
		t.Fatal(err)
	}
	if !promise("k1", e1) || holder("k1") != "a" {
		t.Errorf("b's promise of k1 once the older member left: holder %q, want a", holder("k1"))
	}
	older("c1")
	if !promise("k1", e1) {
		t.Error("b's promise of k1 run again once an older member registered says it did nothing, want promised (it stands)")
	}
	if err := s.Leave(ctx, "c1", "o"); err != nil {
		t.Fatal(err)
	}

	// In another cluster on the schema; then its registration expires.
	e2 := claim("k2")
	older("c2")
	if promise("k2", e2) || holder("k2") != "b" {
		t.Errorf("b's promise of k2 while a member of an older version is live in another cluster: holder %q, want b and nothing promised", holder("k2"))
	}
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'o'`); err != nil {
		t.Fatal(err)
	}
	if !promise("k2", e2) || holder("k2") != "a" {
		t.Errorf("b's promise of k2 once the older member's registration expired: holder %q, want a", holder("k2"))
	}
}

// TestConditionalClaimRefusalNamesAPromise: member b claims key k and promises its claim to
// member a; a claim on b's claim, whether a's own (its activation looked b's claim up before the
// promise) or a third member's, is refused, and the refusal names the claim's owner, a, and the
// member that promised it, b: a's session's line then says b promised a the claim, not that a's
// own claim (one whose answer was lost) came since. Once a claims the key itself, a refusal
// names no promise. Before, the refusal read the claim's epoch and owner only, and a's line said
// its own claim, whose answer was lost, had come since.
func TestConditionalClaimRefusalNamesAPromise(t *testing.T) {
	s, _ := MustOpen(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}, Node: "h1/r_a"}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6341, Kinds: []string{"session"}, Node: "h2/r_b"}
	for _, m := range []Member{a, b} {
		if _, err := s.Heartbeat(ctx, "c1", m, ttl); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := s.Claim(ctx, "k", b.Node, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Promise(ctx, "k", claimed.Epoch, b.Node, a.Node, ttl); err != nil || !ok {
		t.Fatalf("b's promise of k to a: %v, %v", ok, err)
	}
	seenB := persistence.ClaimSeen{Epoch: claimed.Epoch, Owner: b.Node}
	promised := persistence.ClaimSeen{Epoch: claimed.Epoch, Owner: a.Node}
	for _, claimer := range []string{a.Node, "h3/r_c"} {
		_, err := s.Claim(ctx, "k", claimer, time.Now(), &seenB)
		var refusal *persistence.ClaimChangedError
		if !errors.As(err, &refusal) {
			t.Fatalf("%s's claim of k on b's promised claim: %v, want a *persistence.ClaimChangedError", claimer, err)
		}
		if refusal.Latest == nil || *refusal.Latest != promised || refusal.PromisedBy != b.Node {
			t.Errorf("%s's refused claim of k names latest %+v promised by %q, want %+v promised by %q",
				claimer, refusal.Latest, refusal.PromisedBy, promised, b.Node)
		}
	}
	again, err := s.Claim(ctx, "k", a.Node, time.Now(), &promised)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, "k", "h3/r_c", time.Now(), &seenB)
	var refusal *persistence.ClaimChangedError
	if !errors.As(err, &refusal) || refusal.Latest == nil || refusal.Latest.Epoch != again.Epoch || refusal.PromisedBy != "" {
		t.Errorf("a claim of k on b's claim once a claimed k: %v, want a refusal that names a's claim at epoch %d and no promise", err, again.Epoch)
	}
}
