package discord_test

import (
	"context"
	"strings"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestReplyOfWhatDiscordStripsPostsNothing: a reply of nothing but characters Discord strips
// (bidirectional overrides and isolates, which the session keeps) is an empty reply: nothing
// is posted, and it counts as delivered. Before, it was posted, refused as empty (50006),
// logged at ERR as refused for good and recorded failed.
func TestReplyOfWhatDiscordStripsPostsNothing(t *testing.T) {
	marks := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: "\u202e\u2066 \u2069\u202c"}, nil
	})
	w := startWorld(t, marks, nil)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "do the thing"})
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	var state string
	eventually(t, "the reply settled in the outbox", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		if err != nil || len(out) != 1 {
			return false
		}
		state = out[0].State
		return state != persistence.DeliveryPending
	})
	if state != persistence.DeliveryDelivered {
		t.Errorf("the reply's delivery state is %q, want %q", state, persistence.DeliveryDelivered)
	}
	if got := w.srv.Posted(dmID); len(got) != 0 {
		t.Errorf("bot posted %q for a reply of what Discord strips", got)
	}
	if l := w.log.String(); strings.Contains(l, "level=ERROR") {
		t.Errorf("the reply logged an error:\n%s", l)
	}
}

// TestSendOfControlCharactersAlonePostsNothing: an outbound of control characters alone (an
// outbox entry stored before the session took them out of replies, sent again after an
// upgrade) posts nothing and is no error. Before, Discord refused it as empty (50006):
// undeliverable.
func TestSendOfControlCharactersAlonePostsNothing(t *testing.T) {
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dmID, Type: discordgo.ChannelTypeDM})
	p, err := discord.New(discord.Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dmID, Seq: 1, Text: "\x07\x08\x01\x7f\n", TurnEnd: true,
		Target: identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}}
	if err := p.Send(t.Context(), out); err != nil {
		t.Errorf("Send(%q) = %v, want nil", out.Text, err)
	}
	if got := srv.Posted(dmID); len(got) != 0 {
		t.Errorf("bot posted %q", got)
	}
}
