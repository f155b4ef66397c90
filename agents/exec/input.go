package exec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
)

// input is the shape of the JSON object a command reads on stdin.
type input struct {
	Identity identity.Turn    `json:"identity"`
	Messages []agents.Message `json:"messages"`
	History  []agents.Message `json:"history"`
	Notes    []string         `json:"notes,omitempty"`
}

// EncodeInput returns the input object Run writes first to the command's stdin for req: one
// JSON object followed by "\n",
//
//	{"identity": {...identity.Turn...}, "messages": [...], "history": [...], "notes": [...]}
//
// where history holds only the last history entries of req.History (none when history <= 0),
// and of those only the newest that fit in historyBytes of JSON, each whole, the newest always
// (Config.HistoryBytes; 0: no bound), and notes (omitted when empty) are one-line notes from
// agentgate for this turn, such as the continuity note after a session reset. messages and history are always arrays, never null,
// so a script can iterate them without a check. HTML characters are not escaped.
//
// Without steering (Config.Steer false, or no Request.Steer), stdin closes after this line.
// With steering, stdin stays open: each message steered into the running turn follows as one
// line from EncodeSteer,
//
//	{"steer": {"role": "user", "text": "...", "message_id": "...", "at": "..."}}
//
// and stdin closes when the turn's messages end (the caller closes Request.Steer after the
// turn). A command that declares steering must therefore read stdin line by line, not to EOF,
// before it answers; it may exit without reading further lines, and the messages of lines it
// left wholly unread in the pipe are reported in Response.Unseen, to run next, one turn each. A
// buffered reader takes the lines behind the one it returns out of the pipe, and their
// messages count as seen: such a command reads without read-ahead (a byte at a time).
func EncodeInput(req *agents.Request, history, historyBytes int) ([]byte, error) {
	b, _, _, err := encodeInput(req, history, historyBytes)
	return b, err
}

// encodeInput is EncodeInput, and also returns how many history entries it sent, and how many
// of the last history entries the byte bound left out.
func encodeInput(req *agents.Request, history, historyBytes int) (b []byte, sent, leftOut int, err error) {
	if req == nil {
		return nil, 0, 0, errors.New("exec agent: encode input: nil request")
	}
	hist := lastN(req.History, history)
	kept, err := fitBytes(hist, historyBytes)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("exec agent: encode input: %w", err)
	}
	in := input{
		Identity: req.Identity,
		Messages: req.Messages,
		History:  kept,
		Notes:    req.Notes,
	}
	if in.Messages == nil {
		in.Messages = []agents.Message{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(in); err != nil { // Encode ends the object with "\n".
		return nil, 0, 0, fmt.Errorf("exec agent: encode input: %w", err)
	}
	return buf.Bytes(), len(kept), len(hist) - len(kept), nil
}

// fitBytes returns the newest entries of ms whose JSON array, as stdin carries it (brackets and
// commas included), takes at most limit bytes: the oldest are left out first, whole, and the
// newest is kept even when it alone takes more (it is most often the reply the new message
// answers, "shorten that", and one entry is bounded on its own: a reply by MaxReply, a
// message by its platform). limit <= 0: no bound.
func fitBytes(ms []agents.Message, limit int) ([]agents.Message, error) {
	if limit <= 0 || len(ms) == 0 {
		return ms, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	used := 1 // "[", and "]" or a comma after each entry
	for i := len(ms) - 1; i >= 0; i-- {
		buf.Reset()
		if err := enc.Encode(ms[i]); err != nil {
			return nil, err
		}
		used += buf.Len() // the entry and Encode's "\n", the size of the "]" or "," after it
		if used > limit && i < len(ms)-1 {
			return ms[i+1:], nil
		}
	}
	return ms, nil
}

// steerLine is the shape of one steered message on stdin.
type steerLine struct {
	Steer agents.Message `json:"steer"`
}

// EncodeSteer returns the line Run writes to a steering command's stdin for a message steered
// into the running turn: {"steer": m} as one JSON object followed by "\n". HTML characters are
// not escaped.
func EncodeSteer(m agents.Message) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(steerLine{Steer: m}); err != nil { // Encode ends the object with "\n".
		return nil, fmt.Errorf("exec agent: encode steer: %w", err)
	}
	return buf.Bytes(), nil
}

// lastN returns the last n entries of ms, as a non-nil slice.
func lastN(ms []agents.Message, n int) []agents.Message {
	if n <= 0 || len(ms) == 0 {
		return []agents.Message{}
	}
	if len(ms) > n {
		ms = ms[len(ms)-n:]
	}
	return ms
}
