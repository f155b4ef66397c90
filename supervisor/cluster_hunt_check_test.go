//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"slices"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// check compares what the hunt saw and what the store holds with the guarantees.
func (h *hunt) check() {
	t := h.t
	ctx := t.Context()
	h.rec.mu.Lock()
	calls := slices.Clone(h.rec.calls)
	overlaps := slices.Clone(h.rec.overlaps)
	h.rec.mu.Unlock()
	for _, c := range calls {
		h.logf("call %s on %s %s msgs=%v events %d–%d cancelled=%v (at %d, before it began %v) killed=%v", c.turn, c.member, c.sid, c.msgs,
			c.start, c.end, c.cancelled, c.cancelAt, c.bornCancelled, c.killed)
	}
	for _, a := range h.acks {
		if h.byID[a.id] == a && !a.accepted() {
			if row, err := h.store.FindInbound(ctx, a.src.Platform, a.src.ChatID, a.id); err == nil {
				a.stored = row
			}
		}
	}

	// Stored exactly once, in the session it was acknowledged in, and done.
	for _, a := range h.acks {
		if h.byID[a.id] != a || !a.taken() || a.cmd != "" {
			continue
		}
		var n int
		if err := h.admin.QueryRow(ctx, `SELECT COUNT(*) FROM messages WHERE message_id = $1 AND role = 'user'`, a.id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s (%s) is stored %d times, want once", a.id, a.describe(), n)
		}
		row, err := h.store.FindInbound(ctx, a.src.Platform, a.src.ChatID, a.id)
		if err != nil {
			t.Errorf("%s (%s): no stored row: %v", a.id, a.describe(), err)
			continue
		}
		if a.accepted() && row.SessionID != a.ack.SessionID {
			t.Errorf("%s acknowledged in session %s, stored in %s", a.id, a.ack.SessionID, row.SessionID)
		}
		if row.Status == persistence.StatusPending {
			t.Errorf("%s is still pending after everything ended", a.id)
		}
		a.stored = row
	}

	// Answered exactly once, in its own session, with its own identity, in arrival order.
	for _, key := range h.uniqueKeys() {
		entries, err := h.store.OutboxAfter(ctx, key, 0, 100000)
		if err != nil {
			t.Fatal(err)
		}
		answered := map[string]int{}
		lastArrive, lastID := -1, ""
		for _, e := range entries {
			h.logf("outbox %s #%d %s %s turn=%s in_reply_to=%v %s %.70q", key, e.Seq, e.SessionID, e.Kind, e.TurnID, e.InReplyTo, e.State, e.Text)
			for _, id := range e.InReplyTo {
				answered[id]++
				a := h.byID[id]
				if a == nil {
					t.Errorf("outbox %s #%d answers %s, which was never sent", key, e.Seq, id)
					continue
				}
				if a.key != key {
					t.Errorf("outbox %s #%d answers %s of key %s", key, e.Seq, id, a.key)
				}
				// (A boundary's notice, in the new session, answers what it cut short in the old.)
				if e.Kind == platforms.KindReply && a.stored != nil && a.cmd == "" && a.stored.SessionID != e.SessionID {
					t.Errorf("outbox %s #%d in session %s answers %s, stored in session %s", key, e.Seq, e.SessionID, id, a.stored.SessionID)
				}
				if a.cmd != "" || answered[id] > 1 {
					continue
				}
				if a.arrive < lastArrive {
					t.Errorf("key %s: %s (arrived #%d) answered after %s (arrived #%d), at outbox #%d", key, id, a.arrive, lastID, lastArrive, e.Seq)
				}
				lastArrive, lastID = a.arrive, id
			}
			if e.State != "delivered" {
				t.Errorf("outbox %s #%d is %s after everything ended", key, e.Seq, e.State)
			}
			if e.Kind != platforms.KindReply {
				continue
			}
			env := parseHuntReply(e.Text)
			if env == nil {
				t.Errorf("reply %s #%d is not the agent's: %.80q", key, e.Seq, e.Text)
				continue
			}
			a := h.byID[env["MESSAGE_ID"]]
			switch {
			case env["SESSION_KEY"] != key || env["SESSION_ID"] != e.SessionID || env["TURN_ID"] != e.TurnID || env["COUNT"] != "11":
				t.Errorf("reply %s #%d of session %s turn %s carries the identity %v", key, e.Seq, e.SessionID, e.TurnID, env)
			case a == nil || !slices.Contains(e.InReplyTo, a.id):
				t.Errorf("reply %s #%d answers %v but ran for message %s", key, e.Seq, e.InReplyTo, env["MESSAGE_ID"])
			case a.src.ChatID != env["CHAT_ID"] || a.src.ThreadID != env["THREAD_ID"] || a.src.UserID != env["USER_ID"] || env["PLATFORM"] != a.src.Platform:
				t.Errorf("reply %s #%d for %s (of %s) ran as chat %s thread %s user %s", key, e.Seq, a.id, a.src.UserID, env["CHAT_ID"], env["THREAD_ID"], env["USER_ID"])
			}
		}
		for _, a := range h.acks {
			if h.byID[a.id] != a || a.key != key || a.cmd != "" && !a.accepted() || a.cmd == "admin" {
				continue // a command refused with an error may have acted or not
			}
			switch n := answered[a.id]; {
			case a.taken() && n != 1:
				t.Errorf("%s (%s via %s) answered %d times, want once", a.id, a.describe(), a.via, n)
			case !a.taken() && n > 0:
				t.Errorf("%s (%s) was not taken but answered %d times", a.id, a.describe(), n)
			}
		}
	}
	// A re-delivery is a duplicate; or queued when the cluster router had to send it again
	// itself (known gap, docs/ARCHITECTURE.md: the router cannot tell that retry's duplicate
	// from its own first attempt's); it is answered once all the same (checked above).
	for _, a := range h.acks {
		if a.redo && h.byID[a.id] != a && h.byID[a.id].accepted() && a.err == nil &&
			a.ack.Disposition != platforms.Duplicate && (a.ack.Disposition != platforms.Queued || a.cmd != "") {
			t.Errorf("%s re-delivered via %s after it was accepted: %s, want duplicate", a.id, a.via, a.describe())
		}
	}

	// No two turns of a session at once, on one member or two. On one member a session waits
	// for a cancelled call to return before the next turn starts (an interrupt, /stop, a
	// reset, a crash), so no overlap is allowed there. Across members, a call cut short before
	// the next began (its member's drain deadline, its member killed) may still be ending as it
	// begins; a call cut short only after the next began (its session fenced by the next's
	// claim, say) ran beside it.
	for _, o := range overlaps {
		run, next := o[0], o[1]
		switch {
		case run.cancelAt != 0 && run.cancelAt < next.start, run.killed && run.end < next.start:
			continue
		}
		t.Errorf("key %s: turn %s (msgs %v) began on %s at event %d while turn %s (msgs %v) ran on %s (events %d–%d)",
			next.key, next.turn, next.msgs, next.member, next.start, run.turn, run.msgs, run.member, run.start, run.end)
	}

	// Per key, messages first run in arrival order (calls cut short excepted: see above).
	for _, key := range h.uniqueKeys() {
		seen := map[string]bool{}
		prev, prevID := -1, ""
		for _, c := range calls {
			if c.key != key || c.cancelled || c.killed {
				continue
			}
			for _, id := range c.msgs {
				a := h.byID[id]
				if seen[id] || a == nil {
					continue
				}
				seen[id] = true
				if a.arrive < prev {
					t.Errorf("key %s: %s (arrived #%d) first ran after %s (arrived #%d), in turn %s on %s", key, id, a.arrive, prevID, prev, c.turn, c.member)
				}
				prev, prevID = a.arrive, id
			}
		}
	}

	// A boundary is never undone: once /new or /reset moved a key to a new session, nothing
	// is acknowledged in the old one, which stays ended.
	ended := map[string]string{} // session id → the boundary that ended it
	cur := map[string]string{}
	for _, a := range h.acks {
		if !a.accepted() || a.ack.SessionID == "" {
			continue
		}
		sid := a.ack.SessionID
		if by, ok := ended[sid]; ok {
			t.Errorf("%s (%q) acknowledged in session %s, which %s ended", a.id, a.text, sid, by)
		}
		if (a.cmd == "new" || a.cmd == "reset" || a.cmd == "admin") && cur[a.key] != "" && cur[a.key] != sid {
			ended[cur[a.key]] = a.id
		}
		cur[a.key] = sid
	}
	for sid, by := range ended {
		s, err := h.store.Session(ctx, sid)
		if err != nil {
			t.Errorf("session %s: %v", sid, err)
			continue
		}
		if s.EndedAt.IsZero() || s.EndReason != "new_command" && s.EndReason != "reset_command" {
			t.Errorf("session %s, ended by %s, is ended at %v for %q", sid, by, s.EndedAt, s.EndReason)
		}
	}
	for key, sid := range cur {
		r, err := h.store.Route(ctx, key)
		if err != nil || r.SessionID != sid {
			t.Errorf("key %s routes to %+v (%v), want session %s, the last acknowledged", key, r, err, sid)
		}
	}
	for _, c := range calls {
		if by, ok := ended[c.sid]; ok && !c.cancelled && !c.killed {
			if b := h.byID[by]; b != nil && slices.ContainsFunc(c.msgs, func(id string) bool { a := h.byID[id]; return a != nil && a.arrive > b.arrive }) {
				t.Errorf("turn %s ran messages %v in session %s, which %s ended before they arrived", c.turn, c.msgs, c.sid, by)
			}
		}
	}
	events := map[string]int{}
	for _, m := range h.members {
		events[m.state]++
	}
	t.Logf("%d deliveries, %d agent calls, %d overlaps of a cut-short call, members: %v", len(h.acks), len(calls), len(overlaps), events)
}
