package actors

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// command is a parsed slash command.
type command struct {
	name string // without the slash, lower case
	args string
}

// commandHelp lists the commands a session understands, in the order /help shows them.
var commandHelp = []struct{ name, help string }{
	{"new", "end this session and start a fresh one"},
	{"reset", "same as /new"},
	{"stop", "cancel the running turn and drop queued messages"},
	{"status", "show the session id, queue and running turn"},
	{"help", "show this list"},
}

// parseCommand recognises "/word" or "/word args". Text like "/etc/passwd is…" is not a command.
func parseCommand(text string) (command, bool) {
	t := strings.TrimSpace(text)
	if len(t) < 2 || t[0] != '/' {
		return command{}, false
	}
	name, args, _ := strings.Cut(t[1:], " ")
	if i := strings.IndexAny(name, "\n\t"); i >= 0 {
		name, args = name[:i], strings.TrimSpace(t[1+i:])
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return command{}, false
		}
	}
	return command{name: strings.ToLower(name), args: strings.TrimSpace(args)}, true
}

// onCommand runs a command outside the queue. The command and its answer are recorded in one
// write; the requester is acknowledged with disposition "command" once that write is durable.
func (s *Session) onCommand(c actor.Context, m *Deliver, src identity.Source, cmd command, now time.Time) {
	var ops []persistence.Op
	var answer string
	switch cmd.name {
	case "new", "reset":
		reason := persistence.EndNewCommand
		if cmd.name == "reset" {
			reason = persistence.EndResetCommand
		}
		var prev string
		ops, prev = s.boundary(c, src, reason, now)
		answer = fmt.Sprintf("✨ Started a new session (%s).", s.cur.ID)
		if prev != "" {
			answer += " The previous session " + prev + " has ended."
		}
	case "stop":
		var dropped int
		ops, dropped = s.stopWork(c)
		answer = "⏹️ Stopped."
		if dropped > 0 {
			answer += fmt.Sprintf(" Dropped %d queued message(s).", dropped)
		}
		if len(ops) == 0 && dropped == 0 && answer == "⏹️ Stopped." && s.running == nil {
			answer = "Nothing is running."
		}
	case "status":
		answer = s.statusText(now)
	case "help":
		answer = helpText()
	default:
		answer = fmt.Sprintf("Unknown command /%s.\n%s", cmd.name, helpText())
	}
	created := false
	if s.cur == nil {
		var o []persistence.Op
		o, created = s.ensureIncarnation(src, now)
		ops = append(ops, o...)
	}
	sid := s.cur.ID
	s.lastSeq++
	userSeq := s.lastSeq
	s.lastSeq++
	ops = append(ops,
		&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: userSeq, Role: persistence.RoleUser,
			Content: m.Text, Platform: src.Platform, ChatID: src.ChatID, MessageID: m.MessageId,
			UserID: src.UserID, UserName: src.UserName, Status: persistence.StatusDone, Active: true, CreatedAt: now}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: s.lastSeq, Role: persistence.RoleNotice,
			Content: answer, Status: persistence.StatusDone, Active: true, CreatedAt: now}},
		&persistence.TouchSession{SessionID: sid, At: now})
	entry := s.outboxEntry(src, sid, platforms.KindNotice, answer, "", []string{m.MessageId}, now)
	ops = append(ops, &persistence.AddOutbox{Entry: entry})
	if m.MessageId != "" {
		s.seen[m.MessageId] = true
	}
	s.lastActivity = now
	requester := c.Sender()
	s.write(c, ops, func(c actor.Context, err error) {
		if err != nil {
			if created && s.cur != nil && s.cur.ID == sid {
				s.cur = nil
			}
			r := s.result(m, "", sid)
			if errorsIsDuplicate(err) {
				r.Disposition = platforms.Duplicate
			} else {
				delete(s.seen, m.MessageId)
				s.log.Error("store command", "err", err)
				r.ErrorCode, r.Error = "unavailable", "command could not be stored"
			}
			c.Send(requester, r)
			return
		}
		r := s.result(m, platforms.Command, sid)
		c.Send(requester, r)
		s.sendOutbound(c, outboundFromEntry(&entry))
	})
}

// boundary ends the current incarnation with reason and starts a new one. A running turn is
// cancelled and queued messages are dropped (marked failed): a boundary is never undone.
func (s *Session) boundary(c actor.Context, src identity.Source, reason string, now time.Time) ([]persistence.Op, string) {
	ops, _ := s.stopWork(c)
	prev := ""
	if s.cur != nil {
		prev = s.cur.ID
		ops = append(ops, &persistence.EndSession{SessionID: prev, Reason: reason, At: now})
	}
	ops = append(ops, s.newIncarnation(src, now, prev)...)
	return ops, prev
}

// stopWork cancels the running turn and drops the queued messages, returning the ops that
// mark them failed and how many queued messages were dropped.
func (s *Session) stopWork(c actor.Context) ([]persistence.Op, int) {
	var ops []persistence.Op
	if r := s.running; r != nil {
		s.running = nil
		c.Stop(r.pid)
		s.d.Metrics.TurnsTotal.WithLabelValues("cancelled").Inc()
		for _, it := range r.items {
			ops = append(ops, &persistence.SetMessageStatus{SessionID: it.sessionID, Seqs: []int64{it.seq}, Status: persistence.StatusFailed, TurnID: r.id})
		}
	}
	dropped := 0
	var keep []*item
	for _, it := range s.queue {
		if !it.durable {
			keep = append(keep, it) // its write is in flight; it is answered when it lands
			continue
		}
		dropped++
		ops = append(ops, &persistence.SetMessageStatus{SessionID: it.sessionID, Seqs: []int64{it.seq}, Status: persistence.StatusFailed})
	}
	s.queue = keep
	s.updateBusy(c)
	return ops, dropped
}

// onReset ends the session from the admin API.
func (s *Session) onReset(c actor.Context, m *ResetSession) {
	now := s.d.now()
	if s.cur == nil {
		c.Respond(&ResetResult{Error: "session has no current incarnation"})
		return
	}
	reason := m.Reason
	if reason == "" {
		reason = persistence.EndResetCommand
	}
	src := s.sourceOf(s.cur)
	ops, prev := s.boundary(c, src, reason, now)
	requester := c.Sender()
	sid := s.cur.ID
	s.write(c, ops, func(c actor.Context, err error) {
		r := &ResetResult{SessionId: sid, PreviousSessionId: prev}
		if err != nil {
			r.Error = err.Error()
		}
		c.Send(requester, r)
	})
}

func (s *Session) statusText(now time.Time) string {
	var b strings.Builder
	id := "(none yet)"
	if s.cur != nil {
		id = s.cur.ID
	}
	fmt.Fprintf(&b, "Session %s\nKey: %s\nQueue: %d waiting (mode %s, cap %d)\n", id, s.key, s.waiting(), s.mode, s.d.Config.QueueCap)
	if s.running != nil {
		fmt.Fprintf(&b, "Running: turn %s for %s\n", s.running.id, now.Sub(s.running.started).Round(time.Second))
	} else {
		b.WriteString("Running: nothing\n")
	}
	if !s.lastActivity.IsZero() {
		fmt.Fprintf(&b, "Last activity: %s", s.lastActivity.UTC().Format(time.RFC3339))
	}
	return strings.TrimRight(b.String(), "\n")
}

func helpText() string {
	var b strings.Builder
	b.WriteString("Commands:")
	for _, h := range commandHelp {
		fmt.Fprintf(&b, "\n/%s — %s", h.name, h.help)
	}
	return b.String()
}
