package discordtest_test

import (
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// The fake world of most tests: one guild with a text channel, and a DM channel.
const (
	guildID   = "900000000000000001"
	channelID = "900000000000000002"
	dmID      = "900000000000000003"
)

var alice = discordtest.User{ID: "800000000000000001", Username: "alice", GlobalName: "Alice"}

// allIntents is what the adapter is expected to ask for.
const allIntents = discordgo.IntentsGuilds | discordgo.IntentsGuildMessages | discordgo.IntentsDirectMessages |
	discordgo.IntentsMessageContent

func newWorld(t *testing.T, opts ...discordtest.Option) *discordtest.Server {
	t.Helper()
	srv := discordtest.New(t, opts...)
	srv.AddGuild(guildID, "agentgate-test")
	srv.AddChannel(discordtest.Channel{ID: channelID, GuildID: guildID, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	srv.AddChannel(discordtest.Channel{ID: dmID, Type: discordgo.ChannelTypeDM})
	return srv
}

// client is an open discordgo session with its events collected in order (SyncEvents).
type client struct {
	*discordgo.Session
	messages chan *discordgo.MessageCreate
	updates  chan *discordgo.MessageUpdate
	threads  chan *discordgo.ThreadCreate
	guilds   chan *discordgo.GuildCreate
}

// newSession returns a discordgo session that talks to srv, not yet open.
func newSession(t *testing.T, srv *discordtest.Server, token string) *discordgo.Session {
	t.Helper()
	dg, err := discordgo.New(token)
	if err != nil {
		t.Fatalf("discordgo.New() = %v", err)
	}
	dg.Client = srv.Client()
	dg.SyncEvents = true
	return dg
}

// mustOpen opens a session against srv with the given intents, waits until it is Ready,
// and closes it in t.Cleanup (before srv's own cleanup). Closing costs discordgo a
// one-second sleep.
func mustOpen(t *testing.T, srv *discordtest.Server, intents discordgo.Intent, configure ...func(*discordgo.Session)) *client {
	t.Helper()
	dg := newSession(t, srv, "Bot "+srv.Token())
	dg.Identify.Intents = intents
	for _, f := range configure {
		f(dg)
	}
	c := &client{
		Session:  dg,
		messages: make(chan *discordgo.MessageCreate, 100),
		updates:  make(chan *discordgo.MessageUpdate, 100),
		threads:  make(chan *discordgo.ThreadCreate, 100),
		guilds:   make(chan *discordgo.GuildCreate, 100),
	}
	dg.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageCreate) { c.messages <- m })
	dg.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageUpdate) { c.updates <- m })
	dg.AddHandler(func(_ *discordgo.Session, th *discordgo.ThreadCreate) { c.threads <- th })
	dg.AddHandler(func(_ *discordgo.Session, g *discordgo.GuildCreate) { c.guilds <- g })
	if err := dg.Open(); err != nil {
		t.Fatalf("Open() = %v", err)
	}
	t.Cleanup(func() {
		// A heartbeat that fails during Close's one-second sleep would start a reconnect
		// loop that outlives the test.
		dg.ShouldReconnectOnError = false
		dg.Close()
	})
	srv.WaitReady(t)
	return c
}

// mustRecv returns the next value from ch, failing t after WaitTimeout.
func mustRecv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(discordtest.WaitTimeout):
		t.Fatalf("timed out after %v waiting for %s", discordtest.WaitTimeout, what)
		panic("unreachable")
	}
}

// mustBeEmpty fails t if ch holds a value.
func mustBeEmpty[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %+v", what, v)
	default:
	}
}
