package discord

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// resendDM is the DM channel of the tests of sends past the nonce window.
const resendDM = "300000000000000001"

// newResendWorld returns a fake Discord with the DM resendDM, a message a user posted there,
// and a platform on the fake's clock that has not connected (a send needs no gateway).
func newResendWorld(t *testing.T) (*discordtest.Server, *discordgo.Message) {
	t.Helper()
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: resendDM, Type: discordgo.ChannelTypeDM})
	m := srv.Post(discordtest.UserMessage{ChannelID: resendDM, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "question"})
	return srv, m
}

func mustResendPlatform(t *testing.T, srv *discordtest.Server) *Platform {
	t.Helper()
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Now: srv.Now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// replyOut is the reply text to message m in resendDM, made now on srv's clock.
func replyOut(srv *discordtest.Server, m *discordgo.Message, text string) *platforms.Outbound {
	return &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + resendDM, Seq: 1, Kind: platforms.KindReply,
		Text: text, InReplyTo: []string{m.ID}, TurnEnd: true, CreatedAt: srv.Now(),
		Target: identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}}
}

// TestReplySentAgainPastTheNonceWindowIsNotPostedTwice: a reply whose post Discord made but
// whose answer was lost is sent again after an outage longer than Discord enforces a nonce,
// by the same process (the platform actor tries again until the send succeeds) or after a
// restart (the outbox does not show it confirmed). Before, the post with the same nonce made a
// second message; now the send finds the first one in the channel and posts only the parts
// that are missing.
func TestReplySentAgainPastTheNonceWindowIsNotPostedTwice(t *testing.T) {
	long := strings.Repeat("a", 1500) + "\n\n" + strings.Repeat("b", 1500) + "\n\n" + strings.Repeat("c", 1500)
	for _, tc := range []struct {
		name    string
		text    string
		restart bool
	}{
		{"same process", "the answer", false},
		{"after a restart", "the answer", true},
		{"long reply, after a restart", long, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, m := newResendWorld(t)
			p := mustResendPlatform(t, srv)
			out := replyOut(srv, m, tc.text)
			srv.FailNextAfter("POST", "/channels/"+resendDM+"/messages", 500, 1)
			if err := p.Send(t.Context(), out); err == nil {
				t.Fatal("Send whose answer is lost = nil, want an error")
			}
			srv.Advance(discordtest.NonceWindow + time.Minute)
			if tc.restart {
				// The next start finds the reply unconfirmed in the outbox, and sends it again.
				p = mustResendPlatform(t, srv)
				out = sentAgain(out)
			}
			if err := p.Send(t.Context(), out); err != nil {
				t.Fatalf("Send again = %v", err)
			}
			want := Split(tc.text, MaxMessageLen)
			if got := sentTexts(srv, resendDM); !slices.Equal(got, want) {
				t.Errorf("the DM shows %d messages %.40q, want the %d parts of the reply once each", len(got), got, len(want))
			}
		})
	}
}

// TestReplySentAgainPastTheNonceWindowIsPosted: a send past the nonce window whose earlier try
// made nothing posts the reply (another reply of the bot, to another message, with the same
// text, is not taken for it); one whose read of the channel is refused for good posts it too;
// one whose read fails for a while posts nothing and is tried again.
func TestReplySentAgainPastTheNonceWindowIsPosted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		readFail int // the status of the failed read of the channel, if one fails
	}{
		{"read", 0},
		{"read refused for good", 403},
		{"read failing for a while", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, m := newResendWorld(t)
			p := mustResendPlatform(t, srv)
			other := srv.Post(discordtest.UserMessage{ChannelID: resendDM, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "again"})
			if err := p.Send(t.Context(), &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + resendDM, Seq: 9, Text: "the answer",
				InReplyTo: []string{other.ID}, CreatedAt: srv.Now(), Target: identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}}); err != nil {
				t.Fatalf("Send of another reply = %v", err)
			}
			out := replyOut(srv, m, "the answer")
			out.CreatedAt = srv.Now().Add(-time.Minute) // made before the other reply was posted
			srv.FailNext("POST", "/channels/"+resendDM+"/messages", 500, 1)
			if err := p.Send(t.Context(), out); err == nil {
				t.Fatal("Send failing = nil, want an error")
			}
			srv.Advance(discordtest.NonceWindow + time.Minute)
			if tc.readFail != 0 {
				srv.FailNext("GET", "/channels/"+resendDM+"/messages", tc.readFail, 1)
			}
			err := p.Send(t.Context(), out)
			if tc.readFail == 500 {
				if err == nil || errors.Is(err, platforms.ErrUndeliverable) {
					t.Fatalf("Send whose read of the channel fails = %v, want an error to try again after", err)
				}
				if n := len(srv.Sent(resendDM)); n != 1 {
					t.Fatalf("the DM shows %d messages after a failed read, want only the other reply", n)
				}
				err = p.Send(t.Context(), out)
			}
			if err != nil {
				t.Fatalf("Send again = %v", err)
			}
			sent := srv.Sent(resendDM)
			if len(sent) != 2 || sent[1].MessageReference == nil || sent[1].MessageReference.MessageID != m.ID {
				t.Errorf("the DM shows %q, want the other reply and the answer to %s", sentTexts(srv, resendDM), m.ID)
			}
		})
	}
}

// TestSendWithinTheNonceWindowReadsNothing: the read of the channel is for sends past the
// nonce window only: a reply sent as it is made, and one tried again within the window after
// its answer was lost, read nothing and are posted once.
func TestSendWithinTheNonceWindowReadsNothing(t *testing.T) {
	srv, m := newResendWorld(t)
	p := mustResendPlatform(t, srv)
	out := replyOut(srv, m, "the answer")
	srv.FailNextAfter("POST", "/channels/"+resendDM+"/messages", 500, 1)
	if err := p.Send(t.Context(), out); err == nil {
		t.Fatal("Send whose answer is lost = nil, want an error")
	}
	srv.Advance(nonceWindow - time.Second)
	if err := p.Send(t.Context(), out); err != nil {
		t.Fatalf("Send again = %v", err)
	}
	if n := srv.Requests("GET", ""); n != 0 {
		t.Errorf("%d reads, want none", n)
	}
	if n := len(srv.Sent(resendDM)); n != 1 {
		t.Errorf("the DM shows %d messages, want 1", n)
	}
}

// sentAgain is out as the runtime sends it again after a restart (platforms.Outbound.Again).
func sentAgain(out *platforms.Outbound) *platforms.Outbound {
	again := *out
	again.Again = true
	return &again
}

func sentTexts(srv *discordtest.Server, channel string) []string {
	var out []string
	for _, m := range srv.Sent(channel) {
		out = append(out, m.Content)
	}
	return out
}

// TestThreadFirstReplySentAgainPastTheNonceWindowIsPosted: the first reply in an auto-thread
// answers the thread's starter, which lives in the parent channel, so it references nothing.
// Before, a send of it past the nonce window took any unreferenced message of the bot in the
// thread with its text for it, and the reply was never posted; now only the bot's first
// message in the thread is.
func TestThreadFirstReplySentAgainPastTheNonceWindowIsPosted(t *testing.T) {
	const guild, channel = "500000000000000001", "500000000000000002"
	srv := discordtest.New(t)
	srv.AddGuild(guild, "g")
	srv.AddChannel(discordtest.Channel{ID: channel, GuildID: guild, Type: discordgo.ChannelTypeGuildText})
	starter := srv.Post(discordtest.UserMessage{ChannelID: channel, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "question"})
	srv.AddChannel(discordtest.Channel{ID: starter.ID, GuildID: guild, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channel})
	p := mustResendPlatform(t, srv)
	target := identity.Source{Platform: Name, ChatType: identity.ChatThread, ChatID: channel, ThreadID: starter.ID}
	key := "agent:main:discord:thread:" + starter.ID
	out := &platforms.Outbound{SessionKey: key, Seq: 1, Kind: platforms.KindReply, Text: "the answer",
		InReplyTo: []string{starter.ID}, TurnEnd: true, CreatedAt: srv.Now(), Target: target}
	// Found as the bot's first message in the thread, a first reply whose answer was lost is
	// not posted twice.
	srv.FailNextAfter("POST", "/channels/"+starter.ID+"/messages", 500, 1)
	if err := p.Send(t.Context(), out); err == nil {
		t.Fatal("Send whose answer is lost = nil, want an error")
	}
	srv.Advance(discordtest.NonceWindow + time.Minute)
	if err := p.Send(t.Context(), out); err != nil {
		t.Fatalf("Send again = %v", err)
	}
	if got := sentTexts(srv, starter.ID); !slices.Equal(got, []string{"the answer"}) {
		t.Fatalf("the thread shows %q, want the reply once", got)
	}
	srv.Delete(srv.Sent(starter.ID)[0].ID)
	for i, text := range []string{"a notice", "the answer"} { // the bot's earlier unreferenced messages
		if err := p.Send(t.Context(), &platforms.Outbound{SessionKey: key, Seq: int64(10 + i), Kind: platforms.KindNotice,
			Text: text, CreatedAt: srv.Now(), Target: target}); err != nil {
			t.Fatalf("Send of an earlier message = %v", err)
		}
	}
	out.Seq, out.CreatedAt = 2, srv.Now()
	srv.FailNext("POST", "/channels/"+starter.ID+"/messages", 500, 1)
	if err := p.Send(t.Context(), out); err == nil {
		t.Fatal("Send failing = nil, want an error")
	}
	srv.Advance(discordtest.NonceWindow + time.Minute)
	if err := p.Send(t.Context(), out); err != nil {
		t.Fatalf("Send again = %v", err)
	}
	if got, want := sentTexts(srv, starter.ID), []string{"a notice", "the answer", "the answer"}; !slices.Equal(got, want) {
		t.Errorf("the thread shows %q, want %q", got, want)
	}
}
