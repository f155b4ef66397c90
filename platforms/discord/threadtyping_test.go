package discord_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestTypingForAnAutoThreadNotOpenedShowsInTheChannel: when the thread of an auto-threaded
// mention could not be opened (a 5xx: the reply opens it; a 403: the reply goes to the
// channel), the typing indicator of its turn shows in the channel, where the user waits. Before,
// it was sent to the thread, which does not exist: every 8 s Discord answered 404, and the
// user saw nothing.
func TestTypingForAnAutoThreadNotOpenedShowsInTheChannel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int // of every try to open the thread
		n        int // tries that fail
		inThread bool
	}{
		{"opened by the reply", 500, 1, true},
		{"refused for good", 403, 1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
				select { // the turn works until the test has seen the indicator
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return echoAgent(ctx, req)
			})
			w := startWorld(t, agent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
			w.srv.FailNext("POST", "/threads", tc.status, tc.n)
			m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
			w.srv.WaitFor(t, "a typing indicator while the turn works", func() bool { return w.srv.Requests("POST", "/typing") > 0 })
			close(release)
			if tc.inThread {
				w.srv.WaitSent(t, m.ID, 1)
			} else {
				w.replyTo(t, channelID, m.ID)
			}
			if n := w.srv.Requests("POST", "/channels/"+m.ID+"/typing"); n != 0 {
				t.Errorf("%d typing indicators were sent to the thread not opened yet, want none", n)
			}
			if n := w.srv.Typing(channelID); n == 0 {
				t.Errorf("no typing indicator in the channel, where the user waits")
			}
			if got := contents(w.srv.Sent(channelID)); tc.inThread && (len(got) == 0 || !strings.Contains(got[0], "could not open a thread")) {
				t.Errorf("the channel got %q, want the notice that the thread opens later", got)
			}
		})
	}
}
