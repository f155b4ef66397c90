package actors

import "github.com/agentgate/agentgate/persistence"

// runOrder puts a session's rows, read from the store in the order they arrived (by seq), into
// the order their turns ran, which is the order the live history keeps. The two differ when
// messages queue: a message that arrived while a turn ran has a lower seq than that turn's
// reply, yet ran after it. Read in seq order, the history of Q1, Q2 (queued behind Q1), Q3 is
// Q1 Q2 Q3 A1 A2 A3: the agent would see the questions together and then the answers (a model
// agent joins neighbours of a role into one message), and /undo would take back Q3 with every
// answer. Each answered user message moves to just before its turn's first reply; every other
// row keeps its place. rows is returned as is when nothing moves (nearly every activation).
func runOrder(rows []persistence.Message) []persistence.Message {
	firstReply := map[string]int{} // turn id → index of its first reply
	for i := range rows {
		if m := &rows[i]; m.Role == persistence.RoleAssistant && m.TurnID != "" {
			if _, ok := firstReply[m.TurnID]; !ok {
				firstReply[m.TurnID] = i
			}
		}
	}
	// In run order, a turn's messages are followed by nothing but rows of the same turn until
	// its first reply.
	inOrder, open := true, ""
	for i := range rows {
		m := &rows[i]
		if open != "" && m.TurnID != open {
			inOrder = false
			break
		}
		if m.Role == persistence.RoleUser && m.TurnID != "" && firstReply[m.TurnID] > i {
			open = m.TurnID
		} else if m.Role == persistence.RoleAssistant && m.TurnID == open {
			open = ""
		}
	}
	if inOrder {
		return rows
	}
	out := make([]persistence.Message, 0, len(rows))
	held := map[string][]persistence.Message{} // a turn's messages, until its first reply
	for i := range rows {
		m := rows[i]
		if m.Role == persistence.RoleUser && m.TurnID != "" {
			if at, ok := firstReply[m.TurnID]; ok && at > i {
				held[m.TurnID] = append(held[m.TurnID], m)
				continue
			}
		}
		if m.Role == persistence.RoleAssistant && firstReply[m.TurnID] == i && m.TurnID != "" {
			out = append(out, held[m.TurnID]...)
			delete(held, m.TurnID)
		}
		out = append(out, m)
	}
	return out
}
