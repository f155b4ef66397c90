// Package agents defines the Agent interface that runs one conversational turn, and the values
// that cross it. Backends live in sub-packages: echo (the default), exec (any command) and
// openai (an OpenAI-compatible model). An agent is called from a turn actor's goroutine; it must
// honour ctx cancellation (interrupts, timeouts, shutdown) and never keep state that belongs to
// a session.
//
// This package must not import actors, supervisor or platforms.
package agents

import (
	"context"
	"errors"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
)

// Message is one transcript entry shown to an agent.
type Message struct {
	Role      string    `json:"role"` // user | assistant | notice
	Text      string    `json:"text"`
	MessageID string    `json:"message_id,omitempty"`
	At        time.Time `json:"at"`
}

// Request is everything an agent gets for one turn. Identity is the turn's own immutable
// identity; an agent must use nothing else to decide whose turn this is.
type Request struct {
	Identity identity.Turn `json:"identity"`
	// Messages are the new user messages this turn answers, oldest first (several when queued
	// messages were collected into one turn).
	Messages []Message `json:"messages"`
	// History is the recent active transcript before Messages, oldest first.
	History []Message `json:"history"`
	// Notes are one-line notes from agentgate for this turn, such as "this conversation
	// continues session X, which was reset (idle)".
	Notes []string `json:"notes,omitempty"`
	// Steer delivers messages that arrive while the turn runs (queue mode steer) to an agent
	// that can take them (Steerer). It is closed when the turn ends; nil when not steering.
	Steer <-chan Message `json:"-"`
	// Partial receives the reply as it grows (the whole text so far, not a delta) when the
	// platform can edit a message it sent; nil otherwise. An agent that streams calls it from
	// its own goroutine as often as it likes (the runtime throttles the edits) and still returns
	// the whole text in Response; an agent that does not stream ignores it.
	Partial func(text string) `json:"-"`
}

// Steerer is an Agent that can take new user messages into a running turn.
type Steerer interface {
	Agent
	// CanSteer reports whether Run reads Request.Steer.
	CanSteer() bool
}

// CanSteer reports whether a can take messages into a running turn.
func CanSteer(a Agent) bool {
	s, ok := a.(Steerer)
	return ok && s.CanSteer()
}

// Response is an agent's answer for one turn.
type Response struct {
	Text string
	// Usage is what the turn cost in model tokens; zero for agents that do not know.
	Usage Usage
	// Unseen is how many of the messages the agent received from Request.Steer, the last ones,
	// never reached what answers (an exec command that no longer read its stdin): they go back
	// to the head of the session's queue and run next, one turn each (as queue mode followup
	// runs queued messages), instead of counting as answered. It may come next to an error.
	Unseen int
	// RidersLeftOut is set when the answer left out the user messages that got no answer
	// right before Messages (the last user messages of History, which a request carries
	// merged into the turn's own): the endpoint refused the request that carried them without
	// saying why, and answered the same request without them. The session archives them, as
	// it does a declined turn's, so that later turns leave them out too; kept, they rode
	// along with every later message, and got each refused. Only a request answered without
	// them shows that they, not the configuration or the endpoint, were refused: a refusal
	// alone leaves nothing out.
	RidersLeftOut bool
}

// Usage counts the model tokens of one turn.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
}

// ErrStopSignal is wrapped by an agent's error (errors.Is) when the process that ran the turn
// was ended by a signal that stops processes (SIGTERM, SIGINT, SIGHUP, SIGKILL) which agentgate
// did not send: as a service manager does when it stops agentgate and every process it started
// together (systemd's default KillMode=control-group).
var ErrStopSignal = errors.New("agent process ended by a stop signal")

// Refusal is an agent's error that sending the same message again will not get past: the
// model's endpoint refused the request itself (its credentials, the model's name, a
// conversation too long for it), declined to answer, or asked for a wait longer than the agent
// waits (a rate limit's Retry-After: not before then); or the turn outlived the agent's time
// limit (TimedOut), which another try most likely outlives too. Notice says why, to the user,
// in place of the "please try again" of a failed turn: a lower-case clause, without a final
// period.
type Refusal struct {
	Notice string
	// Declined is set when the endpoint declined the message for what it says (a content
	// policy, a content filter, the model's refusal) or the model answered it only by asking
	// for a tool, which it would ask for again: the message is left out of what later turns
	// send, or every later message would carry it and be declined too.
	Declined bool
	Err      error
}

func (r *Refusal) Error() string { return r.Err.Error() }

func (r *Refusal) Unwrap() error { return r.Err }

// TimedOut is the error of a turn the agent stopped because it outlived limit, its own time
// limit for a turn (agent.exec.timeout, agent.openai.timeout): err, in a Refusal that tells the
// user so. Before, the user was asked to try again, which a retry of the same message would
// most likely answer with the same timeout (a new operator's review).
func TimedOut(limit time.Duration, err error) error {
	return &Refusal{Notice: "it took longer than its time limit (" + config.ShortDuration(limit) + ") and was stopped", Err: err}
}

// Agent runs one turn. Run blocks until the turn ends or ctx is cancelled. Next to an error,
// Run may return a Response whose Usage counts the tokens the failed turn spent (its Text is
// ignored).
type Agent interface {
	Run(ctx context.Context, req *Request) (*Response, error)
}

// Func adapts a function to Agent.
type Func func(ctx context.Context, req *Request) (*Response, error)

// Run calls f.
func (f Func) Run(ctx context.Context, req *Request) (*Response, error) { return f(ctx, req) }
