package discord

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// unreadStore keeps the unread places a platform records (SetRecord), as the store does, and
// hands them to the next start (Config.Unread).
type unreadStore struct {
	mu     sync.Mutex
	places map[string]persistence.Unread
}

func newUnreadStore(places ...persistence.Unread) *unreadStore {
	s := &unreadStore{places: map[string]persistence.Unread{}}
	for _, u := range places {
		s.places[u.ChatID] = u
	}
	return s
}

func (s *unreadStore) record(ops ...persistence.Op) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range ops {
		switch o := op.(type) {
		case *persistence.MarkUnread:
			s.places[o.Unread.ChatID] = o.Unread
		case *persistence.ClearUnread:
			if u, ok := s.places[o.ChatID]; ok && u.After == o.After {
				delete(s.places, o.ChatID)
			}
		}
	}
}

func (s *unreadStore) unread(context.Context) ([]persistence.Unread, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.places)), nil
}

// startAgain runs a new platform against srv, as the next start does, with the store's unread
// places (and tweaks to its config), and returns its runtime; it stops when the test ends.
func startAgain(t *testing.T, srv *discordtest.Server, store *unreadStore, tweaks ...func(*Config)) *heldDelivery {
	t.Helper()
	h := newHeldDelivery()
	c := Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL(), BackfillWindow: time.Hour},
		Logger: slog.New(slog.DiscardHandler), Unread: store.unread, Now: srv.Now}
	for _, tweak := range tweaks {
		tweak(&c)
	}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx, h.deliver)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return h
}

// noticeFaults are the ways a stop's notice fails: Discord refuses the post, or does not
// answer it within the stop's notice bound (stopNoticeTimeout), which then runs out for every
// notice after it.
var noticeFaults = []struct {
	name  string
	fault func(srv *discordtest.Server, channel string, answer <-chan struct{})
}{
	{"refused", func(srv *discordtest.Server, channel string, _ <-chan struct{}) {
		srv.FailNext("POST", "/channels/"+channel+"/messages", 500, 5)
	}},
	{"out of time", func(srv *discordtest.Server, channel string, answer <-chan struct{}) {
		srv.HoldNext("POST", "/channels/"+channel+"/messages", answer, 5)
	}},
}

// TestBackfilledMessageWhoseNoticeFailsIsReadBack: a new gateway session's backfill reads a
// thread the store took nothing from lately (an unread place a failed read left; discordgo's
// state does not hold the thread: its messages' handling looks it up), and the daemon stops
// while the first message's lookup waits for Discord. The stop ends the lookup, the stopping
// runtime turns the others away, and their notices, the stop's "send it again", are not posted
// (Discord refuses them, or does not answer within the stop's 3 s). The thread keeps its place
// before them, in the store too, and the next start reads them back and answers them. Before,
// the backfill moved the place past them (the store's was cleared): neither answered, nor
// told, nor read back.
func TestBackfilledMessageWhoseNoticeFailsIsReadBack(t *testing.T) {
	for _, tc := range noticeFaults {
		t.Run(tc.name, func(t *testing.T) {
			const channel, thread = "200000000000000002", "200000000000000003"
			bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
			answer := make(chan struct{})
			defer close(answer) // after the stop: the fake's held handlers end
			store := newUnreadStore(persistence.Unread{Platform: Name, ChatID: thread, ScopeID: recentGuild, After: "1", At: time.Now()})
			var fake *discordtest.Server
			h := newHeldDelivery()
			srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
				fake = srv
				addArchivedThread(srv, channel, thread, bob.ID)
				// Said while no gateway session was up: the backfill reads them back.
				for _, text := range []string{"one", "two", "three"} {
					srv.Post(discordtest.UserMessage{ChannelID: thread, Author: bob, Content: text, MentionBot: true})
				}
				srv.HoldNext("GET", "/channels/"+thread, answer, 1) // the lookup of the first one read back
			}, func(c *Config) {
				c.Settings.BackfillWindow = time.Hour
				c.Unread = store.unread
				c.Now = fake.Now
			}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
			p.SetRecord(store.record)
			srv.WaitFor(t, "the first message's lookup", func() bool { return srv.Requests("GET", "/channels/"+thread) == 1 })
			tc.fault(srv, thread, answer)
			h.drain() // the runtime drains before the platform stops
			stop()
			if s := log.String(); !strings.Contains(s, "its notice not posted; the next start reads it back") {
				t.Errorf("no message was left for the next start:\n%s", s)
			}

			again := startAgain(t, srv, store)
			pollFor(t, "the messages read back", func() bool {
				texts, _, _ := again.got()
				return len(texts) == 3
			})
			if texts, _, _ := again.got(); !slices.Equal(texts, []string{"one", "two", "three"}) {
				t.Errorf("the next start delivered %q, want one, two and three", texts)
			}
		})
	}
}

// TestQueuedMessageWhoseNoticeFailsIsReadBack: the daemon stops while a delivery is held, with
// a message of a new DM queued behind it (the next start does not read that chat back); the
// stopping runtime turns it away, and its notice is not posted (Discord refuses it, or does not
// answer within the stop's 3 s). The DM keeps an unread place before the message in the store,
// and the next start reads it back and answers it. Before, the message was lost, with only the
// WRN that its author was not told.
func TestQueuedMessageWhoseNoticeFailsIsReadBack(t *testing.T) {
	for _, tc := range noticeFaults {
		t.Run(tc.name, func(t *testing.T) {
			const knownDM, newDM = "300000000000000001", "300000000000000002"
			answer := make(chan struct{})
			defer close(answer) // after the stop: the fake's held handlers end
			store := newUnreadStore()
			h := newHeldDelivery()
			srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
				srv.AddChannel(discordtest.Channel{ID: newDM, Type: discordgo.ChannelTypeDM})
			}, func(c *Config) { c.Settings.BackfillWindow = time.Hour },
				discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
			p.SetRecord(store.record)
			alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
			bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
			srv.Post(discordtest.UserMessage{ChannelID: knownDM, Author: alice, Content: "first"})
			<-h.started
			fresh := srv.Post(discordtest.UserMessage{ChannelID: newDM, Author: bob, Content: "hello, first time"})
			waitQueued(t, p, "the new DM's message queued behind the held delivery", 1)
			tc.fault(srv, newDM, answer)
			onStopWait(t, func() {
				h.drain()
				close(h.release)
			})
			stop()
			if s := log.String(); !strings.Contains(s, "its notice not posted; the next start reads it back") || !strings.Contains(s, "message_id="+fresh.ID) {
				t.Errorf("the new DM's message was not left for the next start:\n%s", s)
			}

			again := startAgain(t, srv, store)
			pollFor(t, "the new DM's message read back", func() bool {
				texts, _, _ := again.got()
				return slices.Contains(texts, "hello, first time")
			})
		})
	}
}

// TestMessageLeftInAnOldGapIsReadBack: a stop leaves a message whose notice is not posted in a
// thread whose unread place the store has kept for 50 minutes (a read that failed then; the
// backfill window is an hour), and the next start comes 15 minutes later. It reads the message
// back and answers it. Before, the place kept the time of its first recording, so the next
// start found it older than the window and cleared it without a read, as a place that holds
// only messages older than the window: the message, said 15 minutes before, was lost without a
// word.
func TestMessageLeftInAnOldGapIsReadBack(t *testing.T) {
	const channel, thread = "200000000000000002", "200000000000000003"
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handlers end
	store := newUnreadStore()
	var fake *discordtest.Server
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		fake = srv
		store.places[thread] = persistence.Unread{Platform: Name, ChatID: thread, ScopeID: recentGuild, After: "1", At: srv.Now().Add(-50 * time.Minute)}
		addArchivedThread(srv, channel, thread, bob.ID)
		srv.Post(discordtest.UserMessage{ChannelID: thread, Author: bob, Content: "one", MentionBot: true})
		srv.HoldNext("GET", "/channels/"+thread, answer, 1) // the lookup of the message read back
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Unread = store.unread
		c.Now = fake.Now
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	p.SetRecord(store.record)
	srv.WaitFor(t, "the message's lookup", func() bool { return srv.Requests("GET", "/channels/"+thread) == 1 })
	srv.FailNext("POST", "/channels/"+thread+"/messages", 500, 5)
	h.drain()
	stop()
	if s := log.String(); !strings.Contains(s, "its notice not posted; the next start reads it back") {
		t.Fatalf("the message was not left for the next start:\n%s", s)
	}

	srv.Advance(15 * time.Minute)
	again := startAgain(t, srv, store)
	pollFor(t, "the message read back", func() bool {
		texts, _, _ := again.got()
		return slices.Contains(texts, "one")
	})
}
