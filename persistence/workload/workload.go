// Package workload builds the synthetic chat load that agentgate's benchmarks measure: message
// texts with a skewed (Zipf) word distribution, like the search index sees in chat, the ops of
// one persisted turn, and the statistics the benchmarks report (Median, QuantileUS). The
// persistence actor benchmark, the raw SQLite ceiling and `agentgate bench` all use it, so they
// measure the same writes.
//
// It is pure and deterministic for a given random source. It imports only persistence.
package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TextBytes is the size of every generated message text, and VocabSize the number of words
// they are drawn from (as in shared/reference/perf-anchors.md §0).
const (
	TextBytes = 300
	VocabSize = 5000
)

// Texts returns count message texts of TextBytes bytes: Zipf-distributed (s = 1.1) words from a
// vocabulary of VocabSize pseudo-words, all drawn from r.
func Texts(r *rand.Rand, count int) []string {
	vocab := vocabulary(r, VocabSize)
	zipf := rand.NewZipf(r, 1.1, 1, VocabSize-1)
	texts := make([]string, count)
	for i := range texts {
		var sb strings.Builder
		for sb.Len() < TextBytes {
			if sb.Len() > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(vocab[zipf.Uint64()])
		}
		texts[i] = sb.String()[:TextBytes]
	}
	return texts
}

// vocabulary returns n distinct pseudo-words built from syllables.
func vocabulary(r *rand.Rand, n int) []string {
	syllables := strings.Fields("a an be ca de di en fo ga he in jo ka la li mo na ne or pa " +
		"qu re ri sa se ta ti to un ve wa xe yo za ch sh th st tr pl")
	seen := make(map[string]bool, n)
	words := make([]string, 0, n)
	for len(words) < n {
		var sb strings.Builder
		for range 1 + r.IntN(4) {
			sb.WriteString(syllables[r.IntN(len(syllables))])
		}
		if w := sb.String(); !seen[w] {
			seen[w] = true
			words = append(words, w)
		}
	}
	return words
}

// Turn returns the writes of turn k (0-based) of session s, the gateway turn of
// shared/reference/perf-anchors.md §2d: the user message, the assistant reply, the user
// message's status, the session's activity, its route and the reply's outbox entry. (The daemon
// writes a route only when a session starts, and a delivery mark for every reply: `agentgate
// bench`'s raw ceiling builds its turns from TurnWith to match.)
func Turn(s persistence.Session, k int, user, reply string, at time.Time) []persistence.Op {
	return TurnWith(s, k, fmt.Sprintf("m%d", k+1), fmt.Sprintf("t-%s-%d", s.ID, k+1), user, reply, at)
}

// TurnWith is Turn with the user message's platform id and the turn's id given, for a load
// whose ids must look like a running daemon's.
func TurnWith(s persistence.Session, k int, msgID, turnID, user, reply string, at time.Time) []persistence.Op {
	userSeq, replySeq := int64(2*k+1), int64(2*k+2)
	return []persistence.Op{
		&persistence.AppendMessage{Message: persistence.Message{
			SessionID: s.ID, Seq: userSeq, Role: persistence.RoleUser, Content: user,
			Platform: s.Platform, ChatID: s.ChatID, MessageID: msgID,
			UserID: s.UserID, UserName: s.UserName, Status: persistence.StatusPending,
			Active: true, CreatedAt: at,
		}},
		&persistence.AppendMessage{Message: persistence.Message{
			SessionID: s.ID, Seq: replySeq, Role: persistence.RoleAssistant, Content: reply,
			TurnID: turnID, Status: persistence.StatusDone, Active: true, CreatedAt: at,
		}},
		&persistence.SetMessageStatus{SessionID: s.ID, Seqs: []int64{userSeq}, Status: persistence.StatusDone, TurnID: turnID},
		&persistence.TouchSession{SessionID: s.ID, At: at},
		&persistence.PutRoute{Route: persistence.Route{Key: s.Key, SessionID: s.ID, Generation: int64(k + 1), UpdatedAt: at}},
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{
			SessionKey: s.Key, Seq: int64(k + 1), SessionID: s.ID, Kind: "reply",
			Text: reply, TurnID: turnID, InReplyTo: []string{msgID}, Platform: s.Platform,
			ChatType: s.ChatType, ChatID: s.ChatID, UserID: s.UserID,
			State: persistence.DeliveryPending, CreatedAt: at,
		}},
	}
}
