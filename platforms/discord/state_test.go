package discord

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestArchivedThreadsLeaveTheState: discordgo's state keeps every thread it is told of
// (THREAD_CREATE: every thread opened in the bot's guilds, and one per auto-threaded mention)
// until THREAD_DELETE, which archiving does not send. The platform forgets a thread once it is
// archived, so the state holds the active threads, not every thread of the daemon's lifetime;
// a message in an archived thread is looked up over REST (channelCache) as before.
func TestArchivedThreadsLeaveTheState(t *testing.T) {
	const guild, channel = "100000000000000001", "200000000000000001"
	srv := discordtest.New(t)
	srv.AddGuild(guild, "guild")
	srv.AddChannel(discordtest.Channel{ID: channel, GuildID: guild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { // as the platform actor does: a lost connection ends Run, which runs again
		for {
			err := p.Run(ctx, func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
				return &platforms.Ack{Disposition: platforms.Duplicate}, nil
			})
			if ctx.Err() != nil {
				done <- err
				return
			}
		}
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	srv.WaitReady(t)

	thread := func(i int) string { return fmt.Sprint(500000000000000000 + i) }
	inState := func(id string) bool { _, err := p.s.State.Channel(id); return err == nil }
	addThread := func(id string) {
		srv.AddChannel(discordtest.Channel{ID: id, GuildID: guild, Type: discordgo.ChannelTypeGuildPublicThread,
			ParentID: channel, OwnerID: "400000000000000001", Name: "conversation " + id})
	}
	const threads = 50
	for i := range threads {
		addThread(thread(i))
	}
	pollFor(t, "the threads in the state", func() bool { return inState(thread(threads - 1)) })
	for i := range threads {
		srv.ArchiveThread(thread(i))
	}
	// The gateway's events are handled in order: once the marker's THREAD_CREATE is in the
	// state, every THREAD_UPDATE before it has been handled.
	marker := thread(threads)
	addThread(marker)
	pollFor(t, "the marker thread in the state", func() bool { return inState(marker) })

	kept := 0
	for i := range threads {
		if inState(thread(i)) {
			kept++
		}
	}
	g, err := p.s.State.Guild(guild)
	if err != nil {
		t.Fatal(err)
	}
	p.s.State.RLock()
	listed := len(g.Threads)
	p.s.State.RUnlock()
	if kept != 0 || listed != 1 {
		t.Errorf("after %d threads were archived the state holds %d of them and lists %d threads, want 0 and 1 (the marker)",
			threads, kept, listed)
	}

	// Threads archived while the gateway session was lost: no THREAD_UPDATE ever comes, and the
	// next session's GUILD_CREATE lists only the active ones.
	for i := threads + 1; i <= 2*threads; i++ {
		addThread(thread(i))
	}
	pollFor(t, "the second threads in the state", func() bool { return inState(thread(2 * threads)) })
	srv.InvalidateSession()
	for i := threads + 1; i <= 2*threads; i++ {
		srv.ArchiveThread(thread(i))
	}
	srv.WaitReady(t)
	marker = thread(2*threads + 1)
	addThread(marker)
	pollFor(t, "the second marker thread in the state", func() bool { return inState(marker) })
	kept = 0
	for i := threads + 1; i <= 2*threads; i++ {
		if inState(thread(i)) {
			kept++
		}
	}
	if kept != 0 {
		t.Errorf("after %d threads were archived while the bot was away the state holds %d of them, want 0", threads, kept)
	}
	p.mu.Lock()
	mirrored := len(p.live)
	p.mu.Unlock()
	if mirrored > 2 {
		t.Errorf("the platform remembers %d threads as live, want at most the 2 markers", mirrored)
	}
}

// pollFor polls cond (the client's state, which the fake server cannot wait on) until it holds,
// failing t after discordtest.WaitTimeout.
func pollFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(discordtest.WaitTimeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
