//go:build !race

package supervisor

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
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

// discordMember is a cluster member with Discord enabled (discordDMOnADatabase), whose stop
// may be called again.
type discordMember struct {
	*runtime
	stop func(t testing.TB)
}

// startDiscordMember starts a member of the cluster on dsn with Discord (srv) enabled; logs,
// when set, receives its log. It is stopped when the test ends.
func startDiscordMember(t *testing.T, srv *discordtest.Server, dsn string, logs io.Writer) discordMember {
	t.Helper()
	r := MustStartDaemon(t, echo.New(), daemonOpts{now: srv.Now, logs: logs, tweak: func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
		c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
		c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
	}})
	var once sync.Once
	m := discordMember{runtime: r, stop: func(t testing.TB) { once.Do(func() { r.stop(t) }) }}
	t.Cleanup(func() { m.stop(t) })
	return m
}

// refusalWaits makes the members of the test wait on fire, instead of the retry time, after
// Discord refused their gateway connection; each such wait sends its retry time on waits.
func refusalWaits(t testing.TB) (waits <-chan time.Duration, fire chan<- time.Time) {
	w, f := make(chan time.Duration, 8), make(chan time.Time)
	after := func(d time.Duration) <-chan time.Time { w <- d; return f }
	old := refusalAfter.Swap(&after)
	t.Cleanup(func() { refusalAfter.Store(old) })
	return w, f
}

// mustWaitRefused fails t unless a member waits the 30 minutes after a refusal (refusalWaits).
func mustWaitRefused(t *testing.T, waits <-chan time.Duration) {
	t.Helper()
	select {
	case d := <-waits:
		if d != 30*time.Minute {
			t.Errorf("a refused member waits %v before it tries again, want 30m", d)
		}
	case <-time.After(discordtest.WaitTimeout):
		t.Fatal("no member waits after the refusal: the refused one still holds the gateway lease")
	}
}

// TestClusterDiscordRefusedMemberLetsTheGatewayGo: a member whose gateway connection Discord
// refuses (its token, here) logs the ERR line, lets the gateway lease go, and stays out of it
// for 30 minutes with its /readyz saying why; another member connects and the bot answers.
// After the 30 minutes the refused member stands by again (ready), and takes the gateway over
// when the holder stops. Before, the refused member kept the lease while it waited its 30
// minutes, and the bot heard nothing although another member could have connected.
func TestClusterDiscordRefusedMemberLetsTheGatewayGo(t *testing.T) {
	srv, dm, dsn := discordDMOnADatabase(t)
	waits, fire := refusalWaits(t)
	const refused = `level=ERROR msg="discord refused the bot token`
	const fix = "the bot token was refused (gateway close 4004)"

	srv.RefuseNext(4004, 1)
	aLog := &logSignal{}
	a := startDiscordMember(t, srv, dsn, aLog)
	mustWaitRefused(t, waits)
	if code, body := a.readyz(t); code != http.StatusServiceUnavailable || !strings.Contains(body["platform.discord"], fix) {
		t.Errorf("refused member's /readyz: %d %v, want 503 with platform.discord saying %q", code, body, fix)
	}

	b := startDiscordMember(t, srv, dsn, nil)
	waitUntil(t, func() bool {
		return len(a.d.cluster.MemberList.Members().Members()) == 2 && len(b.d.cluster.MemberList.Members().Members()) == 2
	})
	srv.WaitFor(t, "the other member to identify", func() bool { return srv.Identifies() == 1 })
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "first"})
	if got := srv.WaitSent(t, dm, 1); got[0].Content != "first" {
		t.Fatalf("reply %q, want the echo of the first DM", got[0].Content)
	}
	if _, body := b.readyz(t); body["platform.discord"] != "ok" {
		t.Errorf("holder's /readyz platform.discord = %q, want ok", body["platform.discord"])
	}
	if _, body := a.readyz(t); !strings.Contains(body["platform.discord"], fix) {
		t.Errorf("refused member's /readyz platform.discord = %q while it waits, want %q", body["platform.discord"], fix)
	}

	fire <- time.Time{} // the 30 minutes have passed: a stands by
	waitUntil(t, func() bool { _, body := a.readyz(t); return body["platform.discord"] == "ok" })
	b.stop(t)
	srv.WaitFor(t, "the refused member to take the gateway over", func() bool { return srv.Identifies() == 2 })
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "second"})
	if got := srv.WaitSent(t, dm, 2); got[1].Content != "second" {
		t.Errorf("reply %q after the takeover, want the echo of the second DM", got[1].Content)
	}
	if n := strings.Count(aLog.String(), refused); n != 1 {
		t.Errorf("%d refusal lines on the refused member, want 1\n%s", n, aLog.String())
	}
}

// TestClusterDiscordSharedRefusalIsTriedOncePerMember: a refusal every member meets (the
// Message Content intent, off in the Developer Portal) costs each member one refused
// connection and one ERR line, then 30 minutes out of the race for the gateway lease: the
// members do not hand the lease around, each identify refused, faster than Discord's limits
// take. Once the intent is on, the next try connects.
func TestClusterDiscordSharedRefusalIsTriedOncePerMember(t *testing.T) {
	srv, dm, dsn := discordDMOnADatabase(t)
	waits, fire := refusalWaits(t)
	const refused = `level=ERROR msg="discord refused the message content intent`
	const fix = "the message content intent was refused (gateway close 4014)"

	srv.RefuseNext(4014, 2)
	logs := []*logSignal{{}, {}}
	ms := []discordMember{startDiscordMember(t, srv, dsn, logs[0]), startDiscordMember(t, srv, dsn, logs[1])}
	mustWaitRefused(t, waits)
	mustWaitRefused(t, waits)
	if n := srv.Identifies(); n != 0 {
		t.Fatalf("%d identifies taken while both members wait out their refusals, want 0: a member tried again at once", n)
	}
	for i, m := range ms {
		if n := strings.Count(logs[i].String(), refused); n != 1 {
			t.Errorf("member %d: %d refusal lines, want 1\n%s", i, n, logs[i].String())
		}
		if _, body := m.readyz(t); !strings.Contains(body["platform.discord"], fix) {
			t.Errorf("member %d: /readyz platform.discord = %q, want %q", i, body["platform.discord"], fix)
		}
	}

	fire <- time.Time{} // the intent is turned on, and the 30 minutes pass
	fire <- time.Time{}
	waitUntil(t, func() bool {
		return len(ms[0].d.cluster.MemberList.Members().Members()) == 2 && len(ms[1].d.cluster.MemberList.Members().Members()) == 2
	})
	srv.WaitReady(t)
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "first"})
	if got := srv.WaitSent(t, dm, 1); got[0].Content != "first" {
		t.Fatalf("reply %q, want the echo of the first DM", got[0].Content)
	}
	for i, m := range ms {
		waitUntil(t, func() bool { _, body := m.readyz(t); return body["platform.discord"] == "ok" })
		if n := strings.Count(logs[i].String(), refused); n != 1 {
			t.Errorf("member %d: %d refusal lines after the intent was turned on, want 1", i, n)
		}
	}
	if n := srv.Identifies(); n != 1 {
		t.Errorf("%d identifies, want 1: one member holds the gateway", n)
	}
}

// TestClusterDiscordDeletionAfterTheGatewayMovedIsWithdrawn: a DM taken by the member that held
// the gateway, waiting in its session's queue behind a long turn, is withdrawn when its sender
// deletes it after the gateway moved to another member (the holder's connection was lost, and
// the other member took the lease), while the session stays with the holder: the new holder never delivered it, so it asks the store for it and withdraws it by its
// session's key, wherever the session runs. It is not answered, its row is archived, and the
// turns before and after it are answered. Before, the new holder had no record of the message,
// ignored its deletion without a word, and the message was answered.
func TestClusterDiscordDeletionAfterTheGatewayMovedIsWithdrawn(t *testing.T) {
	srv, dm, dsn := discordDMOnADatabase(t)
	release, started := make(chan struct{}), make(chan struct{}, 4)
	var mu sync.Mutex
	var ran []string
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		mu.Lock()
		for _, m := range req.Messages {
			ran = append(ran, m.Text)
		}
		mu.Unlock()
		if req.Messages[0].Text == "first" {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echo.New().Run(ctx, req)
	})
	start := func(logs io.Writer) *runtime {
		r := MustStartDaemon(t, agent, daemonOpts{now: srv.Now, logs: logs, tweak: func(c *config.Config) {
			c.Store.Driver, c.Store.DSN = "postgres", dsn
			c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
			c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
		}})
		t.Cleanup(func() { r.stop(t) })
		return r
	}
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	post := func(text string) *discordgo.Message {
		return srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: text})
	}
	holder := start(nil)
	srv.WaitReady(t)
	post("first")
	<-started
	gone := post("to be deleted")
	stored := func(id string, cond func(*persistence.Message) bool) func() bool {
		return func() bool {
			m, err := holder.d.Store().FindInbound(t.Context(), discord.Name, dm, id)
			return err == nil && cond(m)
		}
	}
	waitUntil(t, stored(gone.ID, func(m *persistence.Message) bool { return m.Active }))

	nextLog := &logSignal{want: "discord gateway session was new: read what was missed", ready: make(chan struct{})}
	next := start(nextLog)
	waitUntil(t, func() bool {
		return len(holder.d.cluster.MemberList.Members().Members()) == 2 && len(next.d.cluster.MemberList.Members().Members()) == 2
	})
	// The holder's connection is lost: its Run ends, and the lease goes to the next member,
	// which waits for it, while the holder's platform waits a second before it runs again.
	srv.Disconnect()
	select { // the next member holds the gateway, and has read back what it would (nothing)
	case <-nextLog.ready:
	case <-time.After(discordtest.WaitTimeout):
		t.Fatalf("the next member never took the gateway over:\n%s", nextLog.String())
	}
	srv.Delete(gone.ID)
	// Its intake hands on in order: once a later message is stored, the deletion's withdrawal
	// has returned.
	third := post("third")
	waitUntil(t, stored(third.ID, func(m *persistence.Message) bool { return m.Active }))
	if m, err := holder.d.Store().FindInbound(t.Context(), discord.Name, dm, gone.ID); err != nil || m.Active || !m.Archived {
		t.Errorf("the deleted message's row = %+v (err %v), want it archived", m, err)
	}
	close(release)
	sent := srv.WaitSent(t, dm, 2)
	var answered []string
	for _, m := range sent {
		answered = append(answered, m.Content)
	}
	if want := []string{"first", "third"}; !slices.Equal(answered, want) {
		t.Errorf("replies %q, want %q (not the deleted message's)", answered, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(ran, "to be deleted") {
		t.Errorf("agent ran %q, want no run of the deleted message", ran)
	}
}
