package exec_test

import (
	"fmt"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/identity"
)

// The JSON object a command reads on stdin: the turn's identity, its new messages and the last
// History entries of the transcript.
func ExampleEncodeInput() {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	req := &agents.Request{
		Identity: identity.Turn{
			Platform: "http", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1", UserName: "Ann",
			SessionKey: "agent:main:http:dm:c1", SessionID: "s1", MessageID: "m2", TurnID: "t1",
		},
		Messages: []agents.Message{{Role: "user", Text: "and now?", MessageID: "m2", At: at}},
		History: []agents.Message{
			{Role: "user", Text: "hello", MessageID: "m1", At: at.Add(-2 * time.Minute)},
			{Role: "assistant", Text: "hi Ann", At: at.Add(-time.Minute)},
		},
	}
	b, err := exec.EncodeInput(req, 1, 0)
	if err != nil {
		panic(err)
	}
	fmt.Print(string(b))
	// Output:
	// {"identity":{"platform":"http","chat_type":"dm","chat_id":"c1","thread_id":"","user_id":"u1","user_name":"Ann","scope_id":"","profile":"","session_key":"agent:main:http:dm:c1","session_id":"s1","message_id":"m2","turn_id":"t1"},"messages":[{"role":"user","text":"and now?","message_id":"m2","at":"2025-03-01T12:00:00Z"}],"history":[{"role":"assistant","text":"hi Ann","at":"2025-03-01T11:59:00Z"}]}
}

// The line a steering command reads on stdin, after the input object, for each message
// steered into its running turn.
func ExampleEncodeSteer() {
	at := time.Date(2025, 3, 1, 12, 0, 30, 0, time.UTC)
	b, err := exec.EncodeSteer(agents.Message{Role: "user", Text: "use <main.go> instead", MessageID: "m3", At: at})
	if err != nil {
		panic(err)
	}
	fmt.Print(string(b))
	// Output:
	// {"steer":{"role":"user","text":"use <main.go> instead","message_id":"m3","at":"2025-03-01T12:00:30Z"}}
}
