package discord_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestMessageToldToSendAgainIsNotAnsweredAfterARestart: a message the store could not take (the
// database and the spool both refusing writes: a full disk) gets a notice asking its sender to
// send it again, and is not stored. The next start's backfill reads the chat after the newest
// message the store took, so it finds the message again, with the bot's notice replying to it.
// It must not answer it: its sender was asked to send it again, and one who did was answered
// twice (found by a Discord soak: 59 messages after a full disk and a restart).
func TestMessageToldToSendAgainIsNotAnsweredAfterARestart(t *testing.T) {
	o := &storetest.Outage{}
	w := newWorld(t, echoAgent, nil)
	w.wrapStore = o.Wrap
	w.start(t)
	w.srv.WaitReady(t)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID) // the store took a message from the DM: the restart reads it back

	roomAgain := w.fillDisk(t, o)
	refused := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "refused"})
	if notice := w.replyTo(t, dmID, refused.ID); !strings.Contains(notice.Content, "send it again") {
		t.Fatalf("the bot replied %q to the message the store refused, want a notice to send it again", notice.Content)
	}
	w.stop(t)
	roomAgain()

	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID)
	// Live messages wait for the backfill, but "after" may be read by the backfill itself (as
	// in TestAutoThreadedMessageToldToSendAgainIsNotAnsweredAfterARestart): its line ends it.
	w.srv.WaitFor(t, "the restart's backfill to end", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	if _, ok := w.stored(t, dmID, refused.ID); ok {
		t.Error("the message its sender was told to send again was taken after the restart")
	}
	// The replies in the DM: the answer, the notice, the answer; not a second reply to the notice's message.
	if got, want := w.answered(dmID), []string{before.ID, refused.ID, after.ID}; !slices.Equal(got, want) {
		t.Errorf("DM replies answer %v, want %v: the message its sender was told to send again is answered once, by its notice", got, want)
	}
}

// TestAutoThreadedMessageToldToSendAgainIsNotAnsweredAfterARestart: as
// TestMessageToldToSendAgainIsNotAnsweredAfterARestart, for a mention that opens a thread
// (auto_thread). Its notice went to the thread, which holds no reply to the message (a thread's
// starter lives in the parent channel), so the next start's backfill of the parent channel found
// no notice replying to it, took it and answered it in its thread, twice for a sender who did as
// asked.
func TestAutoThreadedMessageToldToSendAgainIsNotAnsweredAfterARestart(t *testing.T) {
	o := &storetest.Outage{}
	w := newWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.wrapStore = o.Wrap
	w.start(t)
	w.srv.WaitReady(t)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "before", MentionBot: true})
	w.srv.WaitSent(t, before.ID, 1) // the store took a message from the channel: the restart reads it back

	roomAgain := w.fillDisk(t, o)
	refused := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "refused", MentionBot: true})
	w.srv.WaitFor(t, "a notice to send "+refused.ID+" again", func() bool {
		for _, ch := range []string{channelID, refused.ID} {
			for _, m := range w.srv.Sent(ch) {
				if strings.Contains(m.Content, "send it again") {
					return true
				}
			}
		}
		return false
	})
	w.stop(t)
	roomAgain()

	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after", MentionBot: true})
	w.srv.WaitSent(t, after.ID, 1)
	// The backfill's line ends it. Live messages wait for it, but "after" may be read by the
	// backfill itself (posted before the client's READY was handled: WaitReady waits for the
	// IDENTIFY and a heartbeat) and answered before the backfill's last channel is read.
	w.srv.WaitFor(t, "the restart's backfill to end", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	if _, ok := w.stored(t, channelID, refused.ID); ok {
		t.Error("the message its sender was told to send again was taken after the restart")
	}
	for _, m := range w.srv.Sent(refused.ID) {
		if strings.HasPrefix(m.Content, "echo:") {
			t.Errorf("the message its sender was told to send again was answered in its thread after the restart: %q", m.Content)
		}
	}
}

// fillDisk makes the disk of w's daemon full: o, its store, and its spool refuse every write.
// roomAgain gives the room back, with the daemon stopped.
func (w *world) fillDisk(t *testing.T, o *storetest.Outage) (roomAgain func()) {
	t.Helper()
	spool := filepath.Join(w.cfg.DataDir, "spool")
	if err := os.Rename(spool, spool+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spool, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Down.Store(true)
	return func() {
		t.Helper()
		o.Down.Store(false)
		if err := os.Remove(spool); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(spool+".away", spool); err != nil {
			t.Fatal(err)
		}
	}
}
