// Package echo is the default agent backend: it answers every turn with the text it was given.
// It needs no configuration and no network, so a fresh install (and the daemon's end-to-end
// tests) can run a full turn without an LLM.
//
// Run is safe for concurrent use: it keeps no state, so turns of different sessions running at
// the same time share nothing. It must not import actors, supervisor or platforms.
package echo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agentgate/agentgate/agents"
)

// New returns an agent that replies with the Text of the request's Messages joined with "\n".
// A turn with one message gets exactly that message's text back; a turn with none gets an empty
// reply.
func New() agents.Agent { return agents.Func(run) }

func run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("echo agent: run: %w", err)
	}
	if req == nil {
		return nil, errors.New("echo agent: run: nil request")
	}
	texts := make([]string, len(req.Messages))
	for i, m := range req.Messages {
		texts[i] = m.Text
	}
	return &agents.Response{Text: strings.Join(texts, "\n")}, nil
}
