package openai

import (
	"strings"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
)

// Chat roles of the chat completions API.
const (
	roleSystem    = "system"
	roleUser      = "user"
	roleAssistant = "assistant"
)

// chatMessage is one message of a chat completions request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatRequest is the body of POST /chat/completions.
type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature *float64      `json:"temperature,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	// MaxCompletionTokens replaces MaxTokens for an endpoint that refused it (Agent.completionTokens).
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// CharsPerToken and MessageOverhead make EstimateTokens.
const (
	CharsPerToken   = 4
	MessageOverhead = 4
)

// EstimateTokens estimates what one message costs in a request: one token per CharsPerToken
// ASCII characters (rounded up), one per other character, plus MessageOverhead for its framing.
// It is a deliberate over-approximation that needs no tokenizer; the budget it enforces is a
// guard, not an exact count. Tokenizers give a Chinese or Japanese character about a token, a
// Cyrillic or Greek one half of one, an emoji several: counted at 4 characters a token, a
// Chinese conversation within the budget was 3 to 4 times over it.
func EstimateTokens(content string) int {
	ascii, other := 0, 0
	for i := 0; i < len(content); {
		if content[i] < utf8.RuneSelf {
			ascii++
			i++
			continue
		}
		_, n := utf8.DecodeRuneInString(content[i:])
		other++
		i += n
	}
	return MessageOverhead + (ascii+CharsPerToken-1)/CharsPerToken + other
}

// conversation is what a turn sends to the model, before trimming.
type conversation struct {
	head    []chatMessage // system prompt and notes: never trimmed
	history []chatMessage // oldest first: trimmed
	tail    []chatMessage // the turn's own messages, and its answers and steered messages so far
	// cut is how many history messages the last request (messages) left out, and byBudget
	// whether the token budget left out any of them (else only max_history did).
	cut      int
	byBudget bool
}

// newConversation builds the conversation of req.
func (a *Agent) newConversation(req *agents.Request) *conversation {
	c := &conversation{}
	if a.systemPrompt != "" {
		c.head = append(c.head, chatMessage{Role: roleSystem, Content: a.systemPrompt})
	}
	if notes := nonEmpty(req.Notes); len(notes) > 0 {
		c.head = append(c.head, chatMessage{Role: roleSystem, Content: strings.Join(notes, "\n")})
	}
	c.history = chatMessages(req.History)
	c.tail = chatMessages(req.Messages)
	return c
}

// chatMessages converts transcript entries; notices and unknown roles are left out, and so is
// the note a reply that was cut off ends with (withoutCutNote).
func chatMessages(ms []agents.Message) []chatMessage {
	out := make([]chatMessage, 0, len(ms))
	for _, m := range ms {
		switch m.Role {
		case roleUser:
			out = append(out, chatMessage{Role: m.Role, Content: m.Text})
		case roleAssistant:
			out = append(out, chatMessage{Role: m.Role, Content: withoutCutNote(m.Text)})
		}
	}
	return out
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
	}
	return out
}

// messages returns the request's messages: head, the trimmed history, tail, with messages of
// one role in a row joined into one (joinRuns). It records what the trim left out (cut).
func (c *conversation) messages(maxHistory, budget int) []chatMessage {
	hist, byBudget := trimHistory(c.history, maxHistory, budget, tokens(c.head)+tokens(c.tail))
	c.cut, c.byBudget = len(c.history)-len(hist), byBudget
	out := make([]chatMessage, 0, len(c.head)+len(hist)+len(c.tail))
	out = append(out, c.head...)
	out = append(out, hist...)
	return joinRuns(append(out, c.tail...))
}

// joinRuns joins each run of messages of one role into one message, their texts a blank line
// apart. Many chat templates (Mistral's, Llama 2's, as vLLM and llama.cpp apply them) refuse a
// conversation whose roles do not alternate after one system message, and a session's
// history holds runs of user messages: a message whose turn failed or was interrupted, messages
// collected or steered into one turn. Sent as they are, one failed turn made every later turn
// of the session fail on such a server.
func joinRuns(ms []chatMessage) []chatMessage {
	out := ms[:0]
	for _, m := range ms {
		if n := len(out); n > 0 && out[n-1].Role == m.Role {
			out[n-1].Content += "\n\n" + m.Content
			continue
		}
		out = append(out, m)
	}
	return out
}

// trimHistory keeps the newest messages of hist: at most maxHistory of them, and (when budget
// is positive) only as many as fit in budget next to fixed estimated tokens. A kept history
// never starts with an assistant message (it would answer nothing the model can see).
// byBudget reports whether the budget left out any message.
func trimHistory(hist []chatMessage, maxHistory, budget, fixed int) (kept []chatMessage, byBudget bool) {
	if len(hist) > maxHistory {
		hist = hist[len(hist)-max(maxHistory, 0):]
	}
	if budget > 0 {
		used := fixed + tokens(hist)
		for len(hist) > 0 && used > budget {
			used -= EstimateTokens(hist[0].Content)
			hist = hist[1:]
			byBudget = true
		}
	}
	for len(hist) > 0 && hist[0].Role == roleAssistant {
		hist = hist[1:]
	}
	return hist, byBudget
}

func tokens(ms []chatMessage) int {
	n := 0
	for _, m := range ms {
		n += EstimateTokens(m.Content)
	}
	return n
}
