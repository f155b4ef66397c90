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

// EncodeInput returns what Run writes to the command's stdin for req: one JSON object followed
// by "\n",
//
//	{"identity": {...identity.Turn...}, "messages": [...], "history": [...], "notes": [...]}
//
// notes (omitted when empty) are one-line notes from agentgate for this turn, such as the
// continuity note after a session reset.
//
// where history holds only the last history entries of req.History (none when history <= 0).
// messages and history are always arrays, never null, so a script can iterate them without a
// check. HTML characters are not escaped.
func EncodeInput(req *agents.Request, history int) ([]byte, error) {
	if req == nil {
		return nil, errors.New("exec agent: encode input: nil request")
	}
	in := input{
		Identity: req.Identity,
		Messages: req.Messages,
		History:  lastN(req.History, history),
		Notes:    req.Notes,
	}
	if in.Messages == nil {
		in.Messages = []agents.Message{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(in); err != nil { // Encode ends the object with "\n".
		return nil, fmt.Errorf("exec agent: encode input: %w", err)
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
