package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testClaimAndFence: claims count a key's epoch up from 1, per key; a group fenced with an older
// epoch fails with ErrFenced and leaves no trace, while the other groups of its batch commit;
// a fence of the current (or a later) epoch, or of a key never claimed, passes; claims survive
// PruneSessions. A claim names the owner it replaced, and counts nothing where no cluster
// member died (these owners are no members).
func testClaimAndFence(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	ss := start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 1)
	for i, want := range []persistence.Claimed{{Epoch: 1}, {Epoch: 2, Previous: "member-0"}} {
		got := check(s.Claim(ctx, "k1", fmt.Sprintf("member-%d", i), at(i), nil)).must(t, "Claim(k1)")
		diff(t, fmt.Sprint("claim ", i, " of k1"), got, want)
	}
	if got := check(s.Claim(ctx, "k2", "member-0", at(5), nil)).must(t, "Claim(k2)"); got.Epoch != 1 {
		t.Errorf("first claim of k2: epoch %d, want 1 (epochs are per key)", got.Epoch)
	}
	diff(t, "Ownership(k1)", check(s.Ownership(ctx, "k1")).must(t, "Ownership"),
		&persistence.Ownership{Key: "k1", Epoch: 2, Owner: "member-1", ClaimedAt: at(1)})
	if _, err := s.Claim(ctx, "", "member-0", at(0), nil); err == nil {
		t.Error("Claim of an empty key: nil error, want one")
	}

	appendAt := func(seq int64) persistence.Op {
		return &persistence.AppendMessage{Message: replyMsg(ss.ID, seq, fmt.Sprintf("reply %d", seq))}
	}
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.Fence{Key: "k1", Epoch: 1}, appendAt(1), &persistence.SetTitle{SessionID: ss.ID, Title: "old owner"}},
		{&persistence.Fence{Key: "k1", Epoch: 2}, appendAt(2)},
		{&persistence.Fence{Key: "k1", Epoch: 3}, appendAt(3)}, // not a newer claim: passes
		{&persistence.Fence{Key: "never-claimed", Epoch: 1}, appendAt(4)},
		{&persistence.Fence{Key: "k2", Epoch: 1}, &persistence.SetTitle{SessionID: "s2", Title: "k2's owner"}},
	})
	if !errors.Is(errs[0], persistence.ErrFenced) {
		t.Errorf("group fenced with epoch 1 after claim 2: error %v, want ErrFenced", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("group %d: %v, want it committed", i+1, err)
		}
	}
	var seqs []int64
	for _, m := range check(s.Transcript(ctx, ss.ID)).must(t, "Transcript") {
		seqs = append(seqs, m.Seq)
	}
	diff(t, "transcript seqs after the fenced batch", seqs, []int64{2, 3, 4})
	if got := check(s.Session(ctx, ss.ID)).must(t, "Session").Title; got != "" {
		t.Errorf("title %q: the fenced group's write is stored", got)
	}
	if got := check(s.Session(ctx, "s2")).must(t, "Session").Title; got != "k2's owner" {
		t.Errorf("k2's title %q, want the write fenced by its own claim", got)
	}

	for _, bad := range []*persistence.Fence{{Epoch: 1}, {Key: "k1"}, {Key: "k1", Epoch: -1}} {
		errs := s.Commit(ctx, [][]persistence.Op{{bad, appendAt(9)}})
		if errs[0] == nil || errors.Is(errs[0], persistence.ErrFenced) {
			t.Errorf("Commit(%+v) = %v, want an error other than ErrFenced", *bad, errs[0])
		}
	}

	// A key's epoch never goes back, whatever is pruned.
	MustCommit(t, s, &persistence.PutRoute{Route: route("k1", "s9", 2)},
		&persistence.CreateSession{Session: ended("s9", "k1", 0, 1)})
	MustCommit(t, s, &persistence.EndSession{SessionID: ss.ID, Reason: persistence.EndResetCommand, At: at(2)},
		&persistence.SetMessageStatus{SessionID: ss.ID, Seqs: []int64{2, 3, 4}, Status: persistence.StatusDone})
	check(s.PruneSessions(ctx, at(1_000_000), 0)).must(t, "PruneSessions")
	if got := check(s.Claim(ctx, "k1", "member-2", at(7), nil)).must(t, "Claim after prune"); got.Epoch != 3 {
		t.Errorf("claim of k1 after PruneSessions: epoch %d, want 3", got.Epoch)
	}
}

// testClaimWaitsForFencedCommits is the guarantee an activation relies on: once Claim has
// returned, no group fenced with an older epoch commits, so a snapshot read after the claim is
// the predecessor's final state. A writer commits fenced batches as fast as it can while
// claims run; after each claim the transcript is read, and once the writer has been fenced the
// transcript must not have grown.
func testClaimWaitsForFencedCommits(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	const rounds, perGroup = 20, 20
	for round := range rounds {
		key, sid := fmt.Sprintf("race-%d", round), fmt.Sprintf("race-s%d", round)
		start(t, s, sid, key, 1)
		epoch := check(s.Claim(ctx, key, "old", at(0), nil)).must(t, "Claim").Epoch

		var wg sync.WaitGroup
		var fenced error
		wg.Go(func() {
			seq := int64(0)
			for {
				ops := []persistence.Op{&persistence.Fence{Key: key, Epoch: epoch}}
				for range perGroup {
					seq++
					ops = append(ops, &persistence.AppendMessage{Message: replyMsg(sid, seq, "x")})
				}
				if err := s.Commit(ctx, [][]persistence.Op{ops})[0]; err != nil {
					fenced = err
					return
				}
			}
		})
		// Claim while the writer is busy: after its first commit.
		for len(check(s.Transcript(ctx, sid)).must(t, "Transcript")) == 0 {
		}
		check(s.Claim(ctx, key, "new", at(1), nil)).must(t, "Claim")
		snap := len(check(s.Transcript(ctx, sid)).must(t, "Transcript"))
		wg.Wait()
		if !errors.Is(fenced, persistence.ErrFenced) {
			t.Fatalf("round %d: the old writer stopped with %v, want ErrFenced", round, fenced)
		}
		if final := len(check(s.Transcript(ctx, sid)).must(t, "Transcript")); final != snap {
			t.Fatalf("round %d: %d rows read right after the claim, %d in the end: "+
				"a write fenced by an older epoch committed after the claim", round, snap, final)
		}
	}
}

// testConditionalClaim: a claim with a condition (seen) goes through only while the key's latest
// claim is seen, by epoch and owner (the zero ClaimSeen for a key never claimed), and otherwise
// fails with ErrClaimChanged (no ErrUnavailable: nothing is wrong with the store) and changes
// nothing: the owner stays, its writes are not fenced, and the next claim's epoch follows the
// owner's. Of claims made at once on one seen claim, exactly one goes through.
func testConditionalClaim(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	ss := start(t, s, "s1", "k1", 1)
	never := &persistence.ClaimSeen{}
	refused := func(what string, key string, seen *persistence.ClaimSeen) {
		t.Helper()
		c, err := s.Claim(ctx, key, "member-x", at(9), seen)
		if !errors.Is(err, persistence.ErrClaimChanged) || errors.Is(err, persistence.ErrUnavailable) {
			t.Errorf("%s: Claim(%s, seen %+v) = %+v, %v; want ErrClaimChanged (and no ErrUnavailable)", what, key, *seen, c, err)
		}
	}
	diff(t, "first claim of k1, seen never claimed", check(s.Claim(ctx, "k1", "member-a", at(1), never)).must(t, "Claim"),
		persistence.Claimed{Epoch: 1})
	refused("k1 claimed since it was seen never claimed", "k1", never)
	refused("k1 seen at its epoch by another owner", "k1", &persistence.ClaimSeen{Epoch: 1, Owner: "member-b"})
	// The refusal names the claim that came since: the line of the session refused says who
	// claimed the key.
	if _, err := s.Claim(ctx, "k1", "member-x", at(9), never); err == nil || !strings.Contains(err.Error(), `epoch 1 of "member-a"`) {
		t.Errorf("refused claim of k1: %v; want it to name the key's latest claim, epoch 1 of \"member-a\"", err)
	}
	// ... as a *persistence.ClaimChangedError, from which the session's line tells another
	// member's claim from an operator's reset and its own member's.
	for _, c := range []struct {
		key    string
		seen   persistence.ClaimSeen
		latest persistence.ClaimSeen
	}{
		{"k1", persistence.ClaimSeen{}, persistence.ClaimSeen{Epoch: 1, Owner: "member-a"}},
		{"k1", persistence.ClaimSeen{Epoch: 1, Owner: "member-b"}, persistence.ClaimSeen{Epoch: 1, Owner: "member-a"}},
		{"k2", persistence.ClaimSeen{Epoch: 1, Owner: "member-a"}, persistence.ClaimSeen{}}, // never claimed
	} {
		_, err := s.Claim(ctx, c.key, "member-x", at(9), &c.seen)
		var refusal *persistence.ClaimChangedError
		if !errors.As(err, &refusal) {
			t.Errorf("Claim(%s, seen %+v) = %v; want a *persistence.ClaimChangedError", c.key, c.seen, err)
			continue
		}
		diff(t, fmt.Sprintf("refusal of Claim(%s, seen %+v)", c.key, c.seen), refusal,
			&persistence.ClaimChangedError{Key: c.key, Seen: c.seen, Latest: &c.latest})
	}
	refused("k1 seen at an older epoch", "k1", &persistence.ClaimSeen{Epoch: 0, Owner: "member-a"})
	refused("k1 seen at a later epoch", "k1", &persistence.ClaimSeen{Epoch: 2, Owner: "member-a"})
	refused("k2, never claimed, seen claimed", "k2", &persistence.ClaimSeen{Epoch: 1, Owner: "member-a"})
	if _, err := s.Ownership(ctx, "k2"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Ownership(k2) after a refused claim: %v, want ErrNotFound (no claim made)", err)
	}
	diff(t, "Ownership(k1) after the refused claims", check(s.Ownership(ctx, "k1")).must(t, "Ownership"),
		&persistence.Ownership{Key: "k1", Epoch: 1, Owner: "member-a", ClaimedAt: at(1)})
	MustCommit(t, s, &persistence.Fence{Key: "k1", Epoch: 1}, &persistence.SetTitle{SessionID: ss.ID, Title: "still member-a's"})
	diff(t, "claim of k1 seen at epoch 1 of member-a", check(s.Claim(ctx, "k1", "member-b", at(2),
		&persistence.ClaimSeen{Epoch: 1, Owner: "member-a"})).must(t, "Claim"), persistence.Claimed{Epoch: 2, Previous: "member-a"})
	// A claim on no condition goes through whatever was seen.
	diff(t, "claim of k1 on no condition", check(s.Claim(ctx, "k1", "member-c", at(3), nil)).must(t, "Claim"),
		persistence.Claimed{Epoch: 3, Previous: "member-b"})

	const rounds = 20
	for round := range rounds {
		key := fmt.Sprintf("race-%d", round)
		var seen *persistence.ClaimSeen
		if round%2 == 1 {
			check(s.Claim(ctx, key, "old", at(0), nil)).must(t, "Claim")
			seen = &persistence.ClaimSeen{Epoch: 1, Owner: "old"}
		} else {
			seen = never
		}
		var wg sync.WaitGroup
		var won, lost [2]bool
		var errs [2]error
		for i := range 2 {
			wg.Go(func() {
				_, err := s.Claim(ctx, key, fmt.Sprintf("member-%d", i), at(1), seen)
				won[i], lost[i], errs[i] = err == nil, errors.Is(err, persistence.ErrClaimChanged), err
			})
		}
		wg.Wait()
		if won[0] == won[1] || !lost[0] && !lost[1] {
			t.Fatalf("round %d: two claims at once on seen %+v: %v and %v; want one through and the other ErrClaimChanged", round, *seen, errs[0], errs[1])
		}
		if got := check(s.Ownership(ctx, key)).must(t, "Ownership").Epoch; got != seen.Epoch+1 {
			t.Fatalf("round %d: epoch %d after the claims at once, want %d (one claim)", round, got, seen.Epoch+1)
		}
	}
}
