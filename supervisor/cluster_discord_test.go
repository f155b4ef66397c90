//go:build !race

package supervisor

import (
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
	"github.com/bwmarrin/discordgo"
)

// discordDMOnADatabase starts a fake Discord with one DM channel, whose bot token the members
// read from DISCORD_TOKEN, and a database for the members.
func discordDMOnADatabase(t *testing.T) (srv *discordtest.Server, dm, dsn string) {
	t.Helper()
	srv = discordtest.New(t)
	dm = "300000000000000001"
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	t.Setenv("DISCORD_TOKEN", srv.Token())
	return srv, dm, pgtest.NewDatabase(t)
}

// TestClusterOneDiscordGateway: with Discord enabled on every member, one member holds the
// bot's gateway connection (the others stand by, and are ready); a DM is answered, whichever
// member its session runs on. When that member stops, another takes the gateway over, and the
// next DM is answered too.
func TestClusterOneDiscordGateway(t *testing.T) {
	srv, dm, dsn := discordDMOnADatabase(t)
	var rs []*runtime
	for range 2 {
		rs = append(rs, MustStartDaemon(t, echo.New(), daemonOpts{tweak: func(c *config.Config) {
			c.Store.Driver, c.Store.DSN = "postgres", dsn
			c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
			c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
		}}))
	}
	waitUntil(t, func() bool {
		return len(rs[0].d.cluster.MemberList.Members().Members()) == 2 && len(rs[1].d.cluster.MemberList.Members().Members()) == 2
	})
	srv.WaitReady(t)
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "first"})
	if got := srv.WaitSent(t, dm, 1); got[0].Content != "first" {
		t.Fatalf("reply %q, want the echo of the first DM", got[0].Content)
	}
	if n := srv.Identifies(); n != 1 {
		t.Fatalf("%d gateway identifies for two members, want one", n)
	}
	leader, standby := -1, -1
	for i, r := range rs {
		ready := r.d.ready(t.Context())
		if err := ready["platform.discord"]; err != nil {
			t.Errorf("member %d: /readyz platform.discord = %v, want ready (holding the gateway or standing by)", i, err)
		}
		for _, p := range r.d.platforms {
			if l, ok := p.(*leaderPlatform); ok {
				if l.standby.Load() {
					standby = i
				} else {
					leader = i
				}
			}
		}
	}
	if leader < 0 || standby < 0 {
		t.Fatalf("leader %d, standby %d: want one of each", leader, standby)
	}

	rs[leader].stop(t)
	srv.WaitFor(t, "the standby member to identify", func() bool { return srv.Identifies() == 2 })
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "second"})
	if got := srv.WaitSent(t, dm, 2); got[1].Content != "second" {
		t.Errorf("reply %q after the takeover, want the echo of the second DM", got[1].Content)
	}
	rs[standby].stop(t)
}

// TestClusterDiscordUnreadGapIsReadByTheNextHolder: the place where the gateway holder's
// backfill failed to read is kept in the store (platforms.Recorder), so the member that takes
// the gateway over reads the gap, although the live message taken meanwhile moved the chat's
// newest stored message past it. The holder's platform is wrapped (leaderPlatform): before, the
// wrapper hid the Discord platform's Recorder, nothing was recorded in cluster mode, and the
// gap was lost at the hand-over.
func TestClusterDiscordUnreadGapIsReadByTheNextHolder(t *testing.T) {
	srv, dm, dsn := discordDMOnADatabase(t)
	type member struct {
		*runtime
		stop func(t testing.TB)
	}
	start := func() member {
		r := MustStartDaemon(t, echo.New(), daemonOpts{now: srv.Now, tweak: func(c *config.Config) {
			c.Store.Driver, c.Store.DSN = "postgres", dsn
			c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
			c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
		}})
		var once sync.Once
		m := member{runtime: r, stop: func(t testing.TB) { once.Do(func() { r.stop(t) }) }}
		t.Cleanup(func() { m.stop(t) })
		return m
	}
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	first := start()
	srv.WaitReady(t)
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "before"})
	srv.WaitSent(t, dm, 1)
	first.stop(t)

	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "while down"})
	srv.FailNext("GET", "/channels/"+dm+"/messages", 500, 5) // every try of the holder's backfill
	holder := start()
	srv.WaitFor(t, "the holder to identify", func() bool { return srv.Identifies() == 2 })
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "live"})
	if got := srv.WaitSent(t, dm, 2); got[1].Content != "live" {
		t.Fatalf("reply %q, want the echo of the live DM", got[1].Content)
	}
	waitUntil(t, func() bool { // the unread place stored
		us, err := holder.d.Store().Unread(t.Context(), discord.Name, 0)
		return err == nil && len(us) == 1 && us[0].ChatID == dm
	})

	next := start() // stands by while the holder holds the gateway
	holder.stop(t)
	srv.WaitFor(t, "the next member to identify", func() bool { return srv.Identifies() == 3 })
	if got := srv.WaitSent(t, dm, 3); got[2].Content != "while down" {
		t.Errorf("reply %q after the takeover, want the echo of the DM of the gap", got[2].Content)
	}
	next.stop(t)
}
