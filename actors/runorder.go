package actors

import (
	"slices"

	"github.com/agentgate/agentgate/persistence"
)

// runOrder puts a session's rows, read from the store in the order they arrived (by seq), into
// the order their turns ran, which is the order the live history keeps. The two differ when
// messages queue: a message that arrived while a turn ran has a lower seq than that turn's
// reply, yet ran after it. Read in seq order, the history of Q1, Q2 (queued behind Q1), Q3 is
// Q1 Q2 Q3 A1 A2 A3: the agent would see the questions together and then the answers (a model
// agent joins neighbours of a role into one message), and /undo would take back Q3 with every
// answer. Each answered user message moves to just before its turn's first reply; a row that
// came while such messages waited for their replies (a message whose turn failed before its
// notice was written, which has no reply to move to) moves to just after the last of those
// replies; every other row keeps its place. A failed turn's notice row counts as its reply: a
// message whose write was in the spool twice (noteCopy) is stored under its earlier copy's
// seq, before the rows that came between its two writes, and a failed one came back there at
// the next load, ahead of turns that ran before it, where the live session had it after them
// (TestFailedMessageSpooledTwiceKeepsItsPlaceAfterAReload). rows is returned as is when
// nothing moves (nearly every activation).
func runOrder(rows []persistence.Message) []persistence.Message {
	firstReply := map[string]int{} // turn id → index of its first reply (or failed turn's notice)
	for i := range rows {
		if m := &rows[i]; isReply(m) {
			if _, ok := firstReply[m.TurnID]; !ok {
				firstReply[m.TurnID] = i
			}
		}
	}
	// In run order, a turn's messages are followed by nothing but rows of the same turn until
	// its first reply.
	inOrder, waiting := true, ""
	for i := range rows {
		m := &rows[i]
		if waiting != "" && m.TurnID != waiting {
			inOrder = false
			break
		}
		if m.Role == persistence.RoleUser && m.TurnID != "" && firstReply[m.TurnID] > i {
			waiting = m.TurnID
		} else if isReply(m) && m.TurnID == waiting {
			waiting = ""
		}
	}
	if inOrder {
		return rows
	}
	repliedBefore := func(turn string, i int) bool {
		at, ok := firstReply[turn]
		return ok && at < i
	}
	out := make([]persistence.Message, 0, len(rows))
	held := map[string][]persistence.Message{}  // a turn's messages, until its first reply
	after := map[string][]persistence.Message{} // rows that came while the turn was the last one waiting: they ran after it
	var open []string                           // the turns whose messages are held, oldest first
	for i := range rows {
		m := rows[i]
		t := m.TurnID
		switch {
		case m.Role == persistence.RoleUser && t != "" && firstReply[t] > i:
			if _, ok := held[t]; !ok {
				open = append(open, t)
			}
			held[t] = append(held[t], m)
		case isReply(&m) && firstReply[t] == i:
			out = append(out, held[t]...)
			out = append(out, m)
			out = append(out, after[t]...)
			delete(held, t)
			delete(after, t)
			open = slices.DeleteFunc(open, func(o string) bool { return o == t })
		case len(open) == 0 || repliedBefore(t, i):
			// Nothing waits for its reply, or the row is a later one of a turn that has replied.
			out = append(out, m)
		default:
			// A message that ran after the turns waiting (one whose turn failed: it has no reply
			// to move to), a notice: after the last of them.
			last := open[len(open)-1]
			after[last] = append(after[last], m)
		}
	}
	return out
}

// isReply reports whether m is a turn's reply (runOrder): an answer, or the notice of a turn
// that failed (finish writes it with the turn's id; other notices carry none).
func isReply(m *persistence.Message) bool {
	return m.TurnID != "" && (m.Role == persistence.RoleAssistant || m.Role == persistence.RoleNotice)
}
