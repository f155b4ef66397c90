package discord_test

import (
	"testing"
	"time"

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
