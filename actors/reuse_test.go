package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// The tests of this file are a new user's walkthrough over the HTTP API: in a DM chat, bob sent
// a message with the id of ann's and was answered "duplicate" (202), his text discarded while
// his client believed it delivered. Where the platform asks for it (Deliver.strict_id, which
// the HTTP platform sets), a message that reuses an id of its chat for another message (another
// sender's, or another text) is refused (ErrCodeMessageIDReused, HTTP 409), and nothing is
// stored or run for it; the same sender's same text (a client's retry) stays a duplicate.

// reuseWorld is a world whose DM chat ann and bob both write to (one session: a DM is keyed by
// its chat).
type reuseWorld struct{ *managerWorld }

// heldWorld is a world on the database at path (a new one if empty) whose commits wait, once
// hc.hold is closed, until release is called. The test's end releases them before the world
// stops, so that a failure mid-test ends the bubble rather than deadlocking it.
func heldWorld(t *testing.T, path string) (w reuseWorld, hc *heldCommits, release func()) {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "agentgate.db")
	}
	hc = &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 64)}
	w = reuseWorld{newManagerWorldWith(t, path, okAgent, nil, func(s persistence.Store) persistence.Store { hc.Store = s; return hc })}
	release = sync.OnceFunc(func() { close(hc.release) })
	t.Cleanup(release) // registered after the world's stop, so it runs before it
	return w, hc, release
}

// okAgent answers every turn at once.
var okAgent = agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
	return &agents.Response{Text: "ok"}, nil
})

// send delivers text from user with message id, as a platform that asks for the check of reused
// ids (strict) or not.
func (w reuseWorld) send(user, id, text string, strict bool) *actor.Future {
	src := w.src
	src.UserID = user
	return w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Deliver{SessionKey: w.key,
		Source: sourceToProto(src), MessageId: id, Text: text, StrictId: strict, ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour)
}

// MustAnswer is f's DeliverResult.
func MustAnswer(t *testing.T, what string, f *actor.Future) *DeliverResult {
	t.Helper()
	res, err := f.Result()
	r, ok := res.(*DeliverResult)
	if err != nil || !ok {
		t.Fatalf("%s: %v %v, want a DeliverResult", what, res, err)
	}
	return r
}

// wantReused fails unless r refuses a reused id with a message that tells its sender what to do.
func wantReused(t *testing.T, what string, r *DeliverResult) {
	t.Helper()
	if r.ErrorCode != ErrCodeMessageIDReused || r.Disposition != "" || !strings.Contains(r.Error, "send this one with a new id") {
		t.Errorf("%s = %q %q (%q), want error code %q", what, r.Disposition, r.ErrorCode, r.Error, ErrCodeMessageIDReused)
	}
}

// wantDisposition fails unless r is an acknowledgment with disposition want.
func wantDisposition(t *testing.T, what string, r *DeliverResult, want string) {
	t.Helper()
	if r.ErrorCode != "" || r.Disposition != want {
		t.Errorf("%s = %q %q (%q), want disposition %q", what, r.Disposition, r.ErrorCode, r.Error, want)
	}
}

// userRows returns "user:text" of every inbound row of the key's sessions, oldest session first.
func (w reuseWorld) userRows(t *testing.T) []string {
	t.Helper()
	ss, err := w.store.SessionsOfKey(w.ctx, w.key, 100)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, sess := range slices.Backward(ss) {
		msgs, err := w.store.Transcript(w.ctx, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Role == persistence.RoleUser {
				rows = append(rows, m.UserID+":"+m.Content)
			}
		}
	}
	return rows
}

// wantRows fails unless the key's inbound rows are want.
func (w reuseWorld) wantRows(t *testing.T, want ...string) {
	t.Helper()
	if got := w.userRows(t); !slices.Equal(got, want) {
		t.Errorf("inbound rows %q, want %q", got, want)
	}
}

// TestReusedMessageIDIsRefused covers the places an id's first message can be when another
// message reuses it: its write in flight, taken in this activation, only in the store (after a
// restart), and a command's.
func TestReusedMessageIDIsRefused(t *testing.T) {
	// While ann's write is in flight, bob's message with its id is refused at once, as is ann's
	// own other text; ann's retry waits for her write and is a duplicate.
	t.Run("in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w, hc, release := heldWorld(t, "")
			close(hc.hold)
			first := w.send("ann", "p1", "hello", true)
			<-hc.held
			wantReused(t, "bob's p1 while ann's write is in flight", MustAnswer(t, "bob", w.send("bob", "p1", "x", true)))
			wantReused(t, "ann's other text as p1 while her write is in flight", MustAnswer(t, "ann", w.send("ann", "p1", "hello again", true)))
			retry := w.send("ann", "p1", "hello", true)
			synctest.Wait()
			release()
			wantDisposition(t, "ann's p1", MustAnswer(t, "ann's p1", first), "started")
			wantDisposition(t, "ann's retry of p1", MustAnswer(t, "ann's retry", retry), "duplicate")
			w.awaitTurnEnds(1)
			w.wantRows(t, "ann:hello")
		})
	})
	// Once ann's message is taken, another message with its id is refused, without a read; her
	// retry is a duplicate.
	t.Run("in memory", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := reuseWorld{newManagerWorld(t, okAgent, nil)}
			wantDisposition(t, "ann's p1", MustAnswer(t, "ann", w.send("ann", "p1", "hello", true)), "started")
			w.awaitTurnEnds(1)
			wantReused(t, "bob's p1", MustAnswer(t, "bob", w.send("bob", "p1", "x", true)))
			wantReused(t, "ann's other text as p1", MustAnswer(t, "ann", w.send("ann", "p1", "other", true)))
			wantDisposition(t, "ann's retry of p1", MustAnswer(t, "ann", w.send("ann", "p1", "hello", true)), "duplicate")
			w.wantRows(t, "ann:hello")
		})
	})
	// After a restart only the store knows p1: bob's message and his retry, sent while the
	// first's write is in flight, are both refused (the store's unique index refuses the write),
	// and his later retry too; ann's retry is a duplicate.
	t.Run("in the store", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			w := reuseWorld{newManagerWorldAt(t, path, okAgent, nil)}
			MustAnswer(t, "ann", w.send("ann", "p1", "hello", true))
			w.awaitTurnEnds(1)
			w.stop()

			w, hc, release := heldWorld(t, path)
			close(hc.hold)
			first := w.send("bob", "p1", "x", true)
			<-hc.held
			repeat := w.send("bob", "p1", "x", true)
			// Ann's retry meanwhile is the stored message's: a duplicate, though bob's, noted
			// with the id, is in flight.
			wantDisposition(t, "ann's retry while bob's p1 is in flight", MustAnswer(t, "ann", w.send("ann", "p1", "hello", true)), "duplicate")
			synctest.Wait()
			release()
			wantReused(t, "bob's p1", MustAnswer(t, "bob", first))
			wantReused(t, "bob's p1 repeated while in flight", MustAnswer(t, "bob's repeat", repeat))
			wantReused(t, "bob's p1 sent again", MustAnswer(t, "bob again", w.send("bob", "p1", "x", true)))
			wantDisposition(t, "ann's retry of p1", MustAnswer(t, "ann", w.send("ann", "p1", "hello", true)), "duplicate")
			w.wantRows(t, "ann:hello")
		})
	})
	// A command with a message's id is refused and does not act (/new starts no session), in
	// memory and after a restart; a message with a command's id is refused, also while the
	// command's write is in flight.
	t.Run("command", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			w := reuseWorld{newManagerWorldAt(t, path, okAgent, nil)}
			hello := MustAnswer(t, "ann", w.send("ann", "p1", "hello", true))
			w.awaitTurnEnds(1)
			wantReused(t, "ann's /new as p1", MustAnswer(t, "/new", w.send("ann", "p1", "/new", true)))
			wantDisposition(t, "ann's /status as s1", MustAnswer(t, "/status", w.send("ann", "s1", "/status", true)), "command")
			wantReused(t, "bob's message as s1", MustAnswer(t, "bob", w.send("bob", "s1", "hi", true)))
			wantDisposition(t, "ann's retry of /status", MustAnswer(t, "/status again", w.send("ann", "s1", "/status", true)), "duplicate")
			w.stop()

			w, hc, release := heldWorld(t, path)
			wantReused(t, "ann's /new as p1 after a restart", MustAnswer(t, "/new", w.send("ann", "p1", "/new", true)))
			wantReused(t, "bob's /status as s1 after a restart", MustAnswer(t, "/status", w.send("bob", "s1", "/status", true)))
			close(hc.hold)
			status := w.send("ann", "s2", "/status", true)
			<-hc.held
			wantReused(t, "bob's message as s2 while ann's /status is in flight", MustAnswer(t, "bob", w.send("bob", "s2", "hi", true)))
			release()
			wantDisposition(t, "ann's /status as s2", MustAnswer(t, "/status", status), "command")
			if ss, err := w.store.SessionsOfKey(w.ctx, w.key, 100); err != nil || len(ss) != 1 || ss[0].ID != hello.SessionId {
				t.Errorf("sessions of the key: %+v %v, want only %s (no /new took effect)", ss, err, hello.SessionId)
			}
			w.wantRows(t, "ann:hello", "ann:/status", "ann:/status")
		})
	})
	// A /retry's row holds the text it runs again: its sender's repeat of the /retry is a
	// duplicate, another user's /retry with its id is refused.
	t.Run("retry", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := reuseWorld{newManagerWorld(t, okAgent, nil)}
			MustAnswer(t, "ann", w.send("ann", "m1", "hello", true))
			w.awaitTurnEnds(1)
			wantDisposition(t, "ann's /retry", MustAnswer(t, "/retry", w.send("ann", "r1", "/retry", true)), "command")
			w.awaitTurnEnds(1)
			wantDisposition(t, "ann's /retry again", MustAnswer(t, "/retry again", w.send("ann", "r1", "/retry", true)), "duplicate")
			wantReused(t, "bob's /retry as r1", MustAnswer(t, "bob", w.send("bob", "r1", "/retry", true)))
		})
	})
}

// TestRedeliveryWithOtherTextIsADuplicateWhereIDsAreThePlatforms: a platform whose ids are its
// own (Discord: never reused) does not ask for the check, and its re-delivery of a message
// edited since (a backfill reads the edited text) stays a duplicate, in memory and from the
// store, and runs nothing.
func TestRedeliveryWithOtherTextIsADuplicateWhereIDsAreThePlatforms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		w := reuseWorld{newManagerWorldAt(t, path, okAgent, nil)}
		MustAnswer(t, "ann", w.send("ann", "d1", "hello", false))
		w.awaitTurnEnds(1)
		wantDisposition(t, "d1 edited, in memory", MustAnswer(t, "edited", w.send("ann", "d1", "hello (edited)", false)), "duplicate")
		w.stop()
		w = reuseWorld{newManagerWorldAt(t, path, okAgent, nil)}
		wantDisposition(t, "d1 edited, from the store", MustAnswer(t, "edited", w.send("ann", "d1", "hello (edited)", false)), "duplicate")
		wantDisposition(t, "/new as d1, from the store", MustAnswer(t, "/new", w.send("ann", "d1", "/new", false)), "duplicate")
		w.wantRows(t, "ann:hello")
	})
}

// TestIdSetKeepsSums: an id keeps the content sum it was first noted with, in the small set and
// once it has grown into a map; an id noted without one, or not held, has none.
func TestIdSetKeepsSums(t *testing.T) {
	var s idSet
	s.add("plain")
	for i := range 2 * idSetSmall {
		s.addSum(fmt.Sprint(i), uint64(i+1))
		if i == 0 {
			s.addSum("0", 99) // held already: keeps its sum
		}
		if got := s.sum("0"); got != 1 {
			t.Fatalf("sum(0) = %d after %d ids (map: %v), want 1", got, i+1, s.big != nil)
		}
	}
	if s.big == nil {
		t.Fatalf("after %d ids the set is still a slice", 2*idSetSmall)
	}
	for i := range 2 * idSetSmall {
		if got := s.sum(fmt.Sprint(i)); got != uint64(i+1) {
			t.Errorf("sum(%d) = %d, want %d", i, got, i+1)
		}
	}
	if s.sum("plain") != 0 || s.sum("absent") != 0 || !s.has("plain") {
		t.Errorf("sum(plain) = %d, sum(absent) = %d, has(plain) = %v; want 0, 0, true", s.sum("plain"), s.sum("absent"), s.has("plain"))
	}
}
