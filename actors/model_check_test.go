package actors

import (
	"fmt"
	"slices"
	"strings"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// check compares what the model saw and what the store holds with the guarantees. The daemon
// is still running, quiesced.
func (m *model) check() {
	t := m.t
	m.agent.mu.Lock()
	runs := slices.Clone(m.agent.runs)
	m.agent.mu.Unlock()
	sent := m.fake.Sent()
	m.logf("checking: %d messages, %d agent runs, %d outbounds", len(m.acks), len(runs), len(sent))
	for _, r := range runs {
		m.logf("run %s %s msgs=%v %v–%v cancelled=%v panicked=%v err=%v env=%v", r.ident.TurnID, r.ident.SessionID, r.messages,
			r.start.Sub(modelEpoch), r.end.Sub(modelEpoch), r.cancelled, r.panicked, r.err, r.env != nil)
	}
	for _, o := range sent {
		m.logf("sent %s #%d %s turn=%s in_reply_to=%v %.60q", o.SessionID, o.Seq, o.Kind, o.TurnID, o.InReplyTo, o.Text)
	}
	for _, a := range m.acks {
		if m.byID[a.id] == a && a.unsure() {
			if row, err := m.daemon.store.FindInbound(t.Context(), a.src.Platform, a.src.ChatID, a.id); err == nil {
				a.stored = row
			}
		}
	}
	m.checkIdentity(runs)
	m.checkOrder(runs)
	m.checkAnswers(runs, sent)
	m.checkBoundaries(runs)
	m.checkStore(sent)
	if t.Failed() {
		return
	}
}

// checkIdentity: every turn's command ran with the identity of its own triggering message, in
// the session that message was acknowledged in, and saw no other AGENTGATE_* variable (G1).
func (m *model) checkIdentity(runs []*modelRun) {
	t := m.t
	turns := map[string]bool{}
	for _, r := range runs {
		if turns[r.ident.TurnID] {
			t.Errorf("turn id %s used by two agent calls", r.ident.TurnID)
		}
		turns[r.ident.TurnID] = true
		a := m.byID[r.ident.MessageID]
		if a == nil || !a.taken() {
			t.Errorf("turn %s ran for message %q, which was never accepted (%v)", r.ident.TurnID, r.ident.MessageID, a)
			continue
		}
		for _, id := range r.messages {
			b := m.byID[id]
			if b == nil || b.src.UserID != a.src.UserID || b.sid() != a.sid() {
				t.Errorf("turn %s (for %s of %s in %s) carries message %s of another sender or session", r.ident.TurnID, a.id, a.src.UserID, a.sid(), id)
			}
		}
		if r.env == nil {
			continue
		}
		want := map[string]string{"PLATFORM": a.src.Platform, "SESSION_KEY": a.key, "SESSION_ID": a.sid(),
			"CHAT_ID": a.src.ChatID, "CHAT_TYPE": a.src.ChatType, "THREAD_ID": a.src.ThreadID, "USER_ID": a.src.UserID,
			"USER_NAME": a.src.UserName, "MESSAGE_ID": a.id, "TURN_ID": r.ident.TurnID, "PROFILE": a.src.Profile, "COUNT": "11"}
		for k, v := range want {
			if r.env[k] != v {
				t.Errorf("turn %s for %s: the command's AGENTGATE_%s = %q, want %q", r.ident.TurnID, a.id, k, r.env[k], v)
			}
		}
	}
}

// checkOrder: per session key, turns never overlap, not even a cancelled one with the next
// (its agent's call returns before the next turn starts), and messages first run in the order
// they arrived (G2).
func (m *model) checkOrder(runs []*modelRun) {
	t := m.t
	for _, key := range slices.Compact(slices.Sorted(slices.Values(m.keys))) {
		var last *modelRun
		seen := map[string]bool{}
		prev := -1
		var prevID string
		for _, r := range runs {
			if r.ident.SessionKey != key {
				continue
			}
			if last != nil && r.start.Before(last.end) {
				t.Errorf("key %s: turn %s started at %v while turn %s ran (until %v, cancelled=%v)", key, r.ident.TurnID, r.start.Sub(modelEpoch), last.ident.TurnID, last.end.Sub(modelEpoch), last.cancelled)
			}
			if last == nil || r.end.After(last.end) {
				last = r
			}
			for _, id := range r.messages {
				if seen[id] {
					continue
				}
				seen[id] = true
				a := m.byID[id]
				if a == nil {
					continue
				}
				if a.arrive < prev {
					t.Errorf("key %s: message %s (arrived #%d) first ran after %s (arrived #%d)", key, id, a.arrive, prevID, prev)
				}
				prev, prevID = a.arrive, id
			}
		}
	}
}

// checkAnswers: every accepted message is answered exactly once (by a reply or a notice), no
// outbox entry is sent twice, nothing refused is answered, and each disposition is what
// happened (G4).
func (m *model) checkAnswers(runs []*modelRun, sent []*platforms.Outbound) {
	t := m.t
	type entry struct {
		key string
		seq int64
	}
	sends := map[entry]int{}
	answeredBy := map[string][]*platforms.Outbound{}
	replyOfTurn := map[string]bool{}
	first := map[entry]*platforms.Outbound{}
	lastSeq := map[string]int64{}
	for _, o := range sent {
		if e := (entry{o.SessionKey, o.Seq}); first[e] == nil {
			// A key's replies and notices reach the user in the order they were recorded.
			if o.Seq < lastSeq[o.SessionKey] {
				t.Errorf("outbox entry %s #%d delivered after #%d", o.SessionKey, o.Seq, lastSeq[o.SessionKey])
			}
			lastSeq[o.SessionKey] = max(lastSeq[o.SessionKey], o.Seq)
		}
		e := entry{o.SessionKey, o.Seq}
		if sends[e]++; sends[e] > 1 {
			// Sent again after a kill, whose delivery was not recorded: the same entry.
			if f := first[e]; !m.killed || f.Text != o.Text || !slices.Equal(f.InReplyTo, o.InReplyTo) {
				t.Errorf("outbox entry %s #%d sent %d times: %.80q", o.SessionKey, o.Seq, sends[e], o.Text)
			}
			continue
		}
		first[e] = o
		// G1 where users see it: an answer goes to the chat of the messages it answers, and
		// a reply carries the identity its turn's command ran with.
		for _, id := range o.InReplyTo {
			if a := m.byID[id]; a != nil && (a.key != o.SessionKey || a.src.ChatID != o.Target.ChatID || a.src.ThreadID != o.Target.ThreadID) {
				t.Errorf("outbound %s #%d to chat %s/%s answers %s of %s (chat %s)", o.SessionKey, o.Seq, o.Target.ChatID, o.Target.ThreadID, id, a.key, a.src.ChatID)
			}
		}
		if env := parseModelReply(o.Text); env != nil && (env["SESSION_KEY"] != o.SessionKey || env["SESSION_ID"] != o.SessionID || env["TURN_ID"] != o.TurnID) {
			t.Errorf("reply %s #%d of session %s turn %s carries the command output of %s %s %s", o.SessionKey, o.Seq, o.SessionID, o.TurnID,
				env["SESSION_KEY"], env["SESSION_ID"], env["TURN_ID"])
		}
		if strings.HasPrefix(o.Text, AutoResetNotice) {
			continue // it tells of the reset; the answer to the message itself follows
		}
		for _, id := range o.InReplyTo {
			answeredBy[id] = append(answeredBy[id], o)
		}
		if o.TurnID != "" {
			replyOfTurn[o.TurnID] = true
		}
	}
	for _, a := range m.acks {
		if first := m.byID[a.id]; first != a {
			waiting := a.spooled && a.res != nil && a.res.ErrorCode == "unavailable" // the spool holds it
			if first.accepted() && first.arrive < a.arrive && (a.res == nil || a.res.Disposition != platforms.Duplicate) && !waiting {
				t.Errorf("%s re-delivered after it was accepted: %s, want duplicate", a.id, a.describe())
			}
			continue
		}
		got := answeredBy[a.id]
		switch {
		case !a.taken() && len(got) > 0:
			t.Errorf("%s was not taken (%s) but answered %d time(s)", a.id, a.describe(), len(got))
		case a.taken() && len(got) == 0:
			t.Errorf("%s acknowledged %s but never answered (silently dropped)", a.id, a.describe())
		case len(got) > 1:
			var texts []string
			for _, o := range got {
				texts = append(texts, fmt.Sprintf("#%d %s %.60q", o.Seq, o.Kind, o.Text))
			}
			t.Errorf("%s (%s) answered %d times: %v", a.id, a.describe(), len(got), texts)
		}
		if !a.accepted() {
			continue
		}
		switch a.res.Disposition {
		case platforms.Interrupted:
			// The turn it cut short is answered by the same answer, listed before it.
			// (Unless a command answered it first: /undo took it back, /stop dropped it.)
			if len(got) == 1 && got[0].TurnID != "" && slices.Index(got[0].InReplyTo, a.id) < 1 && !m.cutLater(a) &&
				!m.cutRanAgain(a, runs, answeredBy, got[0]) {
				t.Errorf("%s acknowledged interrupted, but its answer answers no message before it: %v", a.id, got[0].InReplyTo)
			}
		case platforms.Started:
			// (A debounce window holds the turn a while after the acknowledgment.)
			// (It starts as the write is acknowledged, which takes a while on a locked database.)
			if r := firstRun(runs, a.id); r != nil && (r.messages[0] != a.id || (r.start.Before(a.at) || r.start.After(a.ackedAt)) && m.cfg.Debounce == 0) {
				t.Errorf("%s acknowledged started at %v, but first ran in turn %s %v at %v", a.id, a.at.Sub(modelEpoch), r.ident.TurnID, r.messages, r.start.Sub(modelEpoch))
			}
		case platforms.Steered:
			// (A debounce window merges it with its sender's messages just before it, as it
			// merges any burst: steered messages the running turn did not take wait together.)
			if r := firstRun(runs, a.id); r != nil && r.messages[0] != a.id && slices.Index(r.messages, a.id) < r.nreq &&
				!m.debounceMerged(r, slices.Index(r.messages, a.id)) {
				t.Errorf("%s acknowledged steered, but it was neither taken by a running turn nor run at the head of the next (%s %v)", a.id, r.ident.TurnID, r.messages)
			}
		}
	}
}

// debounceMerged reports whether the debounce window explains the first i+1 messages of r's
// request as one burst: each from the sender of the one before it, within the window of it
// (nextGroup merges such a run of messages at the head of the queue).
func (m *model) debounceMerged(r *modelRun, i int) bool {
	if m.cfg.Debounce == 0 {
		return false
	}
	for j := 1; j <= i; j++ {
		prev, cur := m.byID[r.messages[j-1]], m.byID[r.messages[j]]
		if prev == nil || cur == nil || cur.src.UserID != prev.src.UserID || cur.at.Sub(prev.at) > m.cfg.Debounce {
			return false
		}
	}
	return true
}

// cutLater reports whether a command that answers the messages it takes (/undo, /stop, a
// boundary) came to a's key after a: it may have answered what a cut short.
func (m *model) cutLater(a *modelAck) bool {
	return slices.ContainsFunc(m.acks[a.arrive+1:], func(b *modelAck) bool {
		return b.key == a.key && (b.cmd == "admin" || b.accepted() && slices.Contains([]string{"undo", "stop", "new", "reset", "resume"}, b.cmd))
	})
}

// cutRanAgain reports whether, in the outage hunt, every message of the turn a cut short was
// answered on its own before a's answer: the write that marked them cut was refused, and the
// session started again from the store, which still held them to run. Each is answered once,
// in order; only the interrupt's merging of the answers is lost.
func (m *model) cutRanAgain(a *modelAck, runs []*modelRun, answeredBy map[string][]*platforms.Outbound, answer *platforms.Outbound) bool {
	if m.out == nil {
		return false
	}
	var cut []string
	for _, r := range runs {
		if r.ident.SessionKey == a.key && r.cancelled && !r.start.After(a.at) && !r.end.Before(a.at) {
			cut = append(cut, r.messages...)
		}
	}
	return len(cut) > 0 && !slices.ContainsFunc(cut, func(id string) bool {
		got := answeredBy[id]
		return len(got) != 1 || got[0] == answer || got[0].Seq > answer.Seq
	})
}

// firstRun returns the first agent call that carried message id.
func firstRun(runs []*modelRun, id string) *modelRun {
	for _, r := range runs {
		if slices.Contains(r.messages, id) {
			return r
		}
	}
	return nil
}

// checkBoundaries: a session changes only at /new, /reset or /resume, and no turn runs in, or
// sees the history of, a session a boundary ended (unless /resume went back to it) (G6).
func (m *model) checkBoundaries(runs []*modelRun) {
	t := m.t
	cur := map[string]string{}
	was := map[string]bool{} // sessions that were current and were left
	for _, a := range m.acks {
		if a.cmd == "admin" { // a boundary too
			if a.res.SessionId == "" {
				// The session had ended already (an idle or daily reset): the reset changed
				// nothing, and the key's route still names the ended session.
				continue
			}
			if c := cur[a.key]; c != "" && c != a.res.SessionId {
				was[c] = true
			}
			cur[a.key] = a.res.SessionId
			continue
		}
		if !a.accepted() || a.res.SessionId == "" {
			continue
		}
		switch c := cur[a.key]; {
		case a.cmd == "resume" && m.otherKeys(a.key, a.res.SessionId):
			t.Errorf("%s %q switched %s to session %s, another chat's", a.id, a.text, a.key, a.res.SessionId)
		case a.cmd == "new" || a.cmd == "reset" || a.cmd == "resume", c == "":
		case a.res.SessionId == c:
		case m.cfg.ResetFor != nil && !was[a.res.SessionId]:
			// An idle reset started a successor; going back to a session left is never one.
		default:
			t.Errorf("%s acknowledged in session %s, but the key's session is %s (no boundary between)", a.id, a.res.SessionId, c)
		}
		if c := cur[a.key]; c != "" && c != a.res.SessionId {
			was[c] = true
		}
		cur[a.key] = a.res.SessionId
	}
	for _, r := range runs {
		sid := r.ident.SessionID
		for _, h := range r.history {
			var other string
			switch h.Role {
			case persistence.RoleUser:
				text := h.Text
				if _, after, ok := strings.Cut(text, "] "); ok && strings.HasPrefix(text, "[") {
					text = after
				}
				id, _, _ := strings.Cut(text, " ")
				if a := m.byID[id]; a != nil {
					other = a.sid()
				}
			case persistence.RoleAssistant:
				if env := parseModelReply(h.Text); env != nil {
					other = env["SESSION_ID"]
				}
			}
			if other != "" && other != sid {
				t.Errorf("turn %s in session %s was shown %s %.40q of session %s", r.ident.TurnID, sid, h.Role, h.Text, other)
			}
		}
	}
	// /undo takes the caller's last exchange back: no later turn of the session is shown it.
	// /retry runs the message again as its own turn's, not after itself in the history.
	undone := map[string]string{} // the /undo's id → the id of the message it took back
	for _, o := range m.fake.Sent() {
		if _, after, ok := strings.Cut(o.Text, "↩️ Took back your last message"); ok && len(o.InReplyTo) > 0 {
			if _, quoted, ok := strings.Cut(after, "“"); ok {
				id, _, _ := strings.Cut(quoted, " ")
				undone[o.InReplyTo[len(o.InReplyTo)-1]] = id
			}
		}
	}
	for _, a := range m.acks {
		id, ok := undone[a.id]
		if !ok || m.byID[a.id] != a || !a.accepted() {
			continue
		}
		for _, r := range runs[a.runsBefore:] {
			if r.cancelled || r.ident.SessionID != a.res.SessionId {
				continue
			}
			for _, h := range r.history {
				if h.Role == persistence.RoleUser && strings.Contains(h.Text, id+" ") {
					t.Errorf("turn %s was shown %q, which %s took back", r.ident.TurnID, h.Text, a.id)
				}
			}
		}
	}
	for _, r := range runs {
		if a := m.byID[r.ident.MessageID]; a != nil && a.cmd == "retry" {
			for _, h := range r.history {
				if h.Role == persistence.RoleUser && slices.Contains(r.texts, h.Text) {
					t.Errorf("retried turn %s was shown the message it runs again in its history: %q", r.ident.TurnID, h.Text)
				}
			}
		}
	}
	for key, sid := range cur {
		route, err := m.daemon.store.Route(m.t.Context(), key)
		if err != nil {
			t.Errorf("route of %s: %v", key, err)
			continue
		}
		if route.SessionID != sid {
			t.Errorf("key %s routes to session %s, want %s (the last one acknowledged)", key, route.SessionID, sid)
		}
	}
}

// otherKeys reports whether session sid is known as a session of a key other than key.
func (m *model) otherKeys(key, sid string) bool {
	for k, ids := range m.sessions {
		if k != key && slices.Contains(ids, sid) {
			return true
		}
	}
	return false
}

// checkStore: the outbox holds exactly what was delivered, each message row has the status its
// answer says, and every reply has its transcript row.
func (m *model) checkStore(sent []*platforms.Outbound) {
	t := m.t
	ctx := t.Context()
	store := m.daemon.store
	bySeq := map[string]*platforms.Outbound{}
	for _, o := range sent {
		bySeq[fmt.Sprint(o.SessionKey, "#", o.Seq)] = o
	}
	answered := map[string][]persistence.OutboxEntry{}
	for _, key := range slices.Compact(slices.Sorted(slices.Values(m.keys))) {
		entries, err := store.OutboxAfter(ctx, key, 0, 100000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			for _, id := range e.InReplyTo {
				answered[id] = append(answered[id], e)
			}
			o := bySeq[fmt.Sprint(key, "#", e.Seq)]
			delete(bySeq, fmt.Sprint(key, "#", e.Seq))
			switch {
			case o == nil:
				t.Errorf("outbox entry %s #%d (%s %.60q) was never delivered (state %s)", key, e.Seq, e.Kind, e.Text, e.State)
				continue
			case o.Text != e.Text || o.Kind != e.Kind || !slices.Equal(o.InReplyTo, e.InReplyTo) || o.SessionID != e.SessionID:
				t.Errorf("outbox entry %s #%d = %s %v %.60q, but %s %v %.60q was delivered", key, e.Seq, e.Kind, e.InReplyTo, e.Text, o.Kind, o.InReplyTo, o.Text)
			case e.State != "delivered":
				t.Errorf("outbox entry %s #%d was delivered but is marked %s", key, e.Seq, e.State)
			}
			if e.Kind == platforms.KindReply {
				msgs, err := store.Transcript(ctx, e.SessionID)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(msgs, func(r persistence.Message) bool {
					return r.Role == persistence.RoleAssistant && r.TurnID == e.TurnID && r.Content == e.Text
				}) {
					t.Errorf("reply %s #%d of turn %s has no assistant row in session %s", key, e.Seq, e.TurnID, e.SessionID)
				}
			}
		}
	}
	for k, o := range bySeq {
		t.Errorf("delivered %s (%s %.60q) is in no outbox", k, o.Kind, o.Text)
	}
	for _, a := range m.acks {
		if m.byID[a.id] != a || !a.accepted() {
			continue
		}
		row, err := store.FindInbound(ctx, a.src.Platform, a.src.ChatID, a.id)
		if err != nil {
			t.Errorf("%s (%s): no stored row: %v", a.id, a.describe(), err)
			continue
		}
		if row.SessionID != a.res.SessionId {
			t.Errorf("%s acknowledged in session %s, stored in %s", a.id, a.res.SessionId, row.SessionID)
		}
		replied := slices.ContainsFunc(answered[a.id], func(e persistence.OutboxEntry) bool { return e.Kind == platforms.KindReply })
		switch {
		case row.Status == persistence.StatusPending:
			t.Errorf("%s is still pending in the store after everything ended", a.id)
		case a.cmd == "" && row.Status == persistence.StatusDone && !replied:
			t.Errorf("%s is stored done but was answered only by a notice (%v)", a.id, answered[a.id])
		}
	}
}
