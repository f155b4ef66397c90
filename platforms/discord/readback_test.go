package discord

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// readBackWorld is intakeWorld with a guild's text channel the store took a message from lately
// (recentChannel), read back by the first READY's backfill on the fake's clock; setup runs on
// the fake before the platform starts (posts made there are only in the channel's history).
func readBackWorld(t *testing.T, h *heldDelivery, setup func(srv *discordtest.Server)) (*discordtest.Server, *Platform, *testutil.Buffer) {
	t.Helper()
	var fake *discordtest.Server
	srv, p, log, _ := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		fake = srv
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: recentChannel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
		setup(srv)
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Now = fake.Now
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			return []persistence.ChatMark{{ChatID: recentChannel, ScopeID: recentGuild, MessageID: "1", At: fake.Now()}}, nil
		}
	})
	return srv, p, log
}

// heldCount is how many live messages wait while a backfill runs.
func heldCount(p *Platform) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// TestDeletionReachesTheReadBack: messages said while the bot was away are read back by the
// backfill, and handed on one by one; while the first one's delivery is held, its sender
// deletes it, deletes the second and edits the third. The second is never handed on, the
// third is handed on as edited, and the first, under delivery, is withdrawn once delivered, as
// for the messages of the intake's queue (TestReaderIsNotHeldByADelivery). Before, the
// deletions and the edit reached only the queue and the held messages: the read-back ones
// were answered as read, deleted or not.
func TestDeletionReachesTheReadBack(t *testing.T) {
	h := newHeldDelivery()
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	var first, second, third *discordgo.Message
	srv, p, _ := readBackWorld(t, h, func(srv *discordtest.Server) {
		post := func(text string) *discordgo.Message {
			return srv.Post(discordtest.UserMessage{ChannelID: recentChannel, Author: alice, Content: text})
		}
		first, second, third = post("first"), post("second"), post("third")
	})
	<-h.started // the backfill hands the first on
	srv.Delete(first.ID)
	srv.Delete(second.ID)
	srv.Edit(third.ID, "third, edited")
	// A live message while the backfill runs waits for it: held once the deletions and the
	// edit before it were handled.
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "live"})
	pollFor(t, "the live message held behind the backfill", func() bool { return heldCount(p) == 1 })
	close(h.release)
	want := []string{"first", "third, edited", "live"}
	// The live message comes last, behind the withdrawal on the intake.
	pollFor(t, "the live message delivered", func() bool { texts, _, _ := h.got(); return slices.Contains(texts, "live") })
	texts, withdrew, _ := h.got()
	if !slices.Equal(texts, want) {
		t.Errorf("delivered %q, want %q", texts, want)
	}
	if !slices.Equal(withdrew, []string{first.ID}) {
		t.Errorf("withdrew %q, want the first message %s", withdrew, first.ID)
	}
}

// TestTypingOutlastsADuplicateOfTheReadBack: a live message that comes while the backfill reads
// its channel is held, and read back too: the backfill hands it on (its turn starts, the typing
// indicator with it), and the held copy after it, which the runtime acknowledges as a
// duplicate. The indicator runs on until the turn's reply. Before, the duplicate's
// acknowledgment settled the message and stopped the indicator while its turn worked.
func TestTypingOutlastsADuplicateOfTheReadBack(t *testing.T) {
	h := newHeldDelivery()
	read := make(chan struct{})
	srv, p, _ := readBackWorld(t, h, func(srv *discordtest.Server) {
		srv.HoldNext("GET", "/channels/"+recentChannel+"/messages", read, 1)
	})
	srv.WaitFor(t, "the backfill reading the channel", func() bool {
		return srv.Requests("GET", "/channels/"+recentChannel+"/messages") == 1
	})
	m := srv.Post(discordtest.UserMessage{ChannelID: recentChannel, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "hello"})
	pollFor(t, "the live message held behind the backfill", func() bool { return heldCount(p) == 1 })
	close(read)
	pollFor(t, "the message delivered twice, and its second delivery done", func() bool {
		texts, _, _ := h.got()
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(texts) == 2 && p.intaking == nil && p.backfills == 0
	})
	p.typing.mu.Lock()
	tp := p.typing.chans[recentChannel]
	awaited := false
	if tp != nil {
		_, awaited = tp.awaited[m.ID]
	}
	p.typing.mu.Unlock()
	if !awaited {
		t.Error("the typing indicator stopped at the duplicate's acknowledgment, want it running until the turn's reply")
	}
}

// TestDeletionReachesAPageReadBefore: a channel's history takes two pages to read back; while
// the second page is read, its sender deletes a message of the first page and edits another.
// The deleted message is never handed on, and the edited one is handed on as edited: they were
// read back, and wait to be handed on, as the backlog's messages do (TestDeletionReachesTheReadBack).
// Before, the backlog was made of the pages only once the last one was read: the deletion and
// the edit reached nothing, and the message was answered deleted, the other as first said.
func TestDeletionReachesAPageReadBefore(t *testing.T) {
	h := newHeldDelivery()
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	page2 := make(chan struct{})
	var ms []*discordgo.Message
	srv, p, _ := readBackWorld(t, h, func(srv *discordtest.Server) {
		for i := range backfillPageSize + 1 {
			ms = append(ms, srv.Post(discordtest.UserMessage{ChannelID: recentChannel, Author: alice, Content: fmt.Sprintf("m%d", i)}))
		}
		closed := make(chan struct{})
		close(closed)
		srv.HoldNext("GET", "/channels/"+recentChannel+"/messages", closed, 1) // the first page: at once
		srv.HoldNext("GET", "/channels/"+recentChannel+"/messages", page2, 1)
	})
	defer func() {
		select {
		case <-page2:
		default:
			close(page2)
		}
	}()
	srv.WaitFor(t, "the backfill reading the second page", func() bool {
		return srv.Requests("GET", "/channels/"+recentChannel+"/messages") == 2
	})
	gone, changed := ms[len(ms)-1], ms[len(ms)-2] // the newest: on the first page
	srv.Delete(gone.ID)
	srv.Edit(changed.ID, "edited")
	// Events are handled in order: once the live message is held, the deletion and the edit were.
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "live"})
	pollFor(t, "the live message held behind the backfill", func() bool { return heldCount(p) == 1 })
	close(page2)
	pollFor(t, "the live message delivered", func() bool { texts, _, _ := h.got(); return slices.Contains(texts, "live") })
	texts, _, _ := h.got()
	if slices.Contains(texts, gone.Content) {
		t.Errorf("the message %s (%q) deleted while the backfill read its channel was handed on", gone.ID, gone.Content)
	}
	if slices.Contains(texts, changed.Content) || !slices.Contains(texts, "edited") {
		t.Errorf("the message %s (%q) edited while the backfill read its channel was handed on as first said", changed.ID, changed.Content)
	}
	if want := len(ms) - 1 + 1; len(texts) != want {
		t.Errorf("delivered %d messages, want %d (all read back but the deleted one, and the live one)", len(texts), want)
	}
}
