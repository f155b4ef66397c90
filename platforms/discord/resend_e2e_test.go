package discord_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestReplyCutByAStopIsNotPostedTwiceAfterALongStop: Discord posted a reply but its answer was
// lost, and its next try met a rate limit of an hour, so the daemon stopped with the reply
// unconfirmed. It starts again later than Discord enforces a nonce, and sends the reply again:
// before, Discord took the same nonce for a new post, and the reply showed twice.
func TestReplyCutByAStopIsNotPostedTwiceAfterALongStop(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	post := "/channels/" + dmID + "/messages"
	w.srv.FailNextAfter("POST", post, 500, 1)
	w.srv.RateLimitNext("POST", post, time.Hour, 1)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "once please"})
	w.srv.WaitFor(t, "the reply posted, its answer lost, and its next try rate limited", func() bool {
		return w.srv.PendingFaults("POST") == 0
	})
	w.stop(t)
	w.srv.Advance(discordtest.NonceWindow + time.Minute)
	w.start(t)
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	if got := w.settled(t, key); got != persistence.DeliveryDelivered {
		t.Errorf("the reply is %s, want it delivered", got)
	}
	if sent := contents(w.srv.Sent(dmID)); len(sent) != 1 {
		t.Errorf("the DM shows %q, want the reply once", sent)
	}
}

// TestDraftWhosePostsFailPastTheNonceWindowIsFinished: Discord posted a draft but its answer
// was lost, and its next tries failed until later than Discord enforces a nonce. Before, the
// try that succeeded then made a second draft, which the reply finished, and the first stayed
// above it, showing the start of the answer; now the try finds the first draft in the channel,
// and the reply finishes it.
func TestDraftWhosePostsFailPastTheNonceWindowIsFinished(t *testing.T) {
	var w *world
	const final = "thinking done: the whole answer"
	posts := func() int { return w.srv.Requests("POST", "/channels/"+dmID+"/messages") }
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("thinking")
		if err := agentWait(ctx, func() bool { return posts() >= 2 }); err != nil { // the lost post, and a failed retry
			return nil, err
		}
		return &agents.Response{Text: final}, nil
	})
	w = startDraftWorld(t, agent)
	// The post is made and its answer lost, and its next 4 tries fail (in some 2 s of the
	// actor's backoff): the clock is moved past the nonce window in the meantime.
	w.srv.FailNextAfter("POST", "/channels/"+dmID+"/messages", 500, 1)
	w.srv.FailNext("POST", "/channels/"+dmID+"/messages", 500, 4)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	w.srv.WaitFor(t, "a try after the lost post", func() bool { return posts() >= 2 })
	w.srv.Advance(discordtest.NonceWindow + time.Minute)
	w.answerIsTheDraft(t, m, final)
}
