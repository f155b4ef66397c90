package discord_test

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestMessageDeletedWhileDisconnectedIsNotAnswered: a message said and deleted (one by its
// sender, several by a moderator's purge) while the gateway connection was down comes back in
// the RESUME's replay as its MESSAGE_CREATE, then its deletion. Its session is idle: it is not
// run or answered, and the replayed messages around it are, in order, once each. Before, the
// CREATE started a turn at once and the deletion came too late: the bot answered it.
func TestMessageDeletedWhileDisconnectedIsNotAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, chat string
		mention    bool
		delete     func(srv *discordtest.Server, ids ...string)
	}{
		{"by its sender in a DM", dmID, false, func(srv *discordtest.Server, ids ...string) {
			for _, id := range ids {
				srv.Delete(id)
			}
		}},
		{"purged in a channel", channelID, true, (*discordtest.Server).DeleteBulk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newHeldAgent()
			w := startWorld(t, a.agent(), nil)
			post := func(text string) *discordgo.Message {
				return w.srv.Post(discordtest.UserMessage{ChannelID: tc.chat, Author: alice, Content: text, MentionBot: tc.mention})
			}
			before := post("before")
			w.replyTo(t, tc.chat, before.ID)
			w.srv.Disconnect()
			kept1, gone1, gone2, kept2 := post("kept one"), post("never mind"), post("forget it"), post("kept two")
			tc.delete(w.srv, gone1.ID, gone2.ID)
			w.srv.WaitReady(t) // resumed: the replay holds the four messages, then the deletions
			after := post("after")
			w.replyTo(t, tc.chat, after.ID)
			if got, want := w.answered(tc.chat), []string{before.ID, kept1.ID, kept2.ID, after.ID}; !slices.Equal(got, want) {
				t.Errorf("replies answer %v, want %v (before, the two kept, after)", got, want)
			}
			for _, gone := range []string{gone1.ID, gone2.ID} {
				if _, ok := w.stored(t, tc.chat, gone); ok {
					t.Errorf("the message %s deleted while disconnected was stored", gone)
				}
			}
			for _, texts := range a.ran() {
				if slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(s, "never mind") || strings.Contains(s, "forget it") }) {
					t.Errorf("agent runs = %q, want none of a deleted message", a.ran())
					break
				}
			}
			if w.srv.Resumes() == 0 || w.srv.Identifies() != 1 {
				t.Errorf("resumes %d, identifies %d: want the gateway session resumed", w.srv.Resumes(), w.srv.Identifies())
			}
		})
	}
}

// TestMessageEditedWhileDisconnectedIsAnsweredAsEdited: a message said and edited while the
// gateway connection was down comes back in the replay as its MESSAGE_CREATE, then its
// MESSAGE_UPDATE: the turn runs the edited text. Before, the CREATE started a turn with the
// text its sender had replaced.
func TestMessageEditedWhileDisconnectedIsAnsweredAsEdited(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.srv.Disconnect()
	typo := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "waht time is it"})
	w.srv.Edit(typo.ID, "what time is it")
	w.srv.WaitReady(t)
	if got, want := w.replyTo(t, dmID, typo.ID).Content, "echo: what time is it"; got != want {
		t.Errorf("reply to the edited message = %q, want %q", got, want)
	}
}

// TestReplayPastItsHoldIsAnsweredInOrder: a replay with more messages than its hold keeps
// (lowered to 2 here) hands them on in order as the hold fills, and none is lost or answered
// twice.
func TestReplayPastItsHoldIsAnsweredInOrder(t *testing.T) {
	discord.SetMaxReplayHeld(t, 2)
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.srv.Disconnect()
	want := []string{before.ID}
	for _, text := range []string{"one", "two", "three", "four", "five"} {
		want = append(want, w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: text}).ID)
	}
	w.srv.WaitReady(t)
	w.replyTo(t, dmID, want[len(want)-1])
	if got := w.answered(dmID); !slices.Equal(got, want) {
		t.Errorf("replies answer %v, want %v", got, want)
	}
}

// TestReplayCutShortByAStopIsReadBackAfterTheRestart: a message a RESUME's replay holds is
// not dropped when RESUMED never comes because the daemon stops: it is handed to the runtime as
// the connection closes, which no longer takes it, and is left, with its line, for the next
// start, which answers it once. Before the hold was released at a close, it was dropped
// without a line (the next start's backfill read it back all the same, in a chat it reads).
func TestReplayCutShortByAStopIsReadBackAfterTheRestart(t *testing.T) {
	w := newWorld(t, echoAgent, nil)
	w.logLevel = slog.LevelDebug // for discordgo's line of a replayed first packet
	w.start(t)
	w.srv.WaitReady(t)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	release := w.srv.WithholdResumed()
	defer release()
	w.srv.Disconnect()
	held := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "said while away"})
	// The replay's first packet is this message: handled (held) within Open, before the line.
	eventually(t, "the replayed message handled", func() bool {
		return strings.Contains(w.log.String(), "resume replayed missed events before RESUMED")
	})
	w.stop(t)
	if line := `msg="discord message not taken while stopping; the next start reads it back" component=discord platform=discord channel=` + dmID + ` message_id=` + held.ID; !strings.Contains(w.log.String(), line) {
		t.Errorf("the stop's log lacks %s:\n%s", line, w.log.String())
	}
	release()
	w.start(t)
	w.replyTo(t, dmID, held.ID)
	if got, want := w.answered(dmID), []string{before.ID, held.ID}; !slices.Equal(got, want) {
		t.Errorf("replies answer %v, want %v (each once)", got, want)
	}
}

// TestReplayHeldThroughABackfillThatEndsFirst: a backfill (a new gateway session's READY) still
// reading when the connection drops holds the messages the RESUME replays, as it holds live
// ones; when it ends before RESUMED, what it held waits for RESUMED, so a deletion that comes
// after it in the replay still drops it. Before, the backfill's release handed the replayed
// message on at once: its idle session ran it (its deletion came too late), and the agent
// ran a message its sender had deleted.
func TestReplayHeldThroughABackfillThatEndsFirst(t *testing.T) {
	a := newHeldAgent()
	w := newWorld(t, a.agent(), nil)
	w.logLevel = slog.LevelDebug // for discordgo's line of a replayed first packet
	w.start(t)
	w.srv.WaitReady(t)
	w.answeredInBoth(t) // alice's DM, and bob's session in the channel, idle
	asked := w.answered(channelID)

	// A new gateway session: its backfill reads the DM, whose first page waits, and cannot read
	// the channel (no Read Message History), so it reads back nothing said there.
	hold := make(chan struct{})
	w.srv.HoldNext("GET", "/channels/"+dmID+"/messages", hold, 1)
	w.srv.FailNext("GET", "/channels/"+channelID+"/messages", http.StatusForbidden, 1)
	w.srv.InvalidateSession()
	w.srv.WaitFor(t, "the new session's backfill reading", func() bool { return w.srv.Requests("GET", "/channels/"+dmID+"/messages") == 1 })

	// The connection drops while the backfill reads; the RESUME replays a mention bob said
	// meanwhile, and RESUMED waits.
	release := w.srv.WithholdResumed()
	defer release()
	w.srv.Disconnect()
	gone := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "never mind", MentionBot: true})
	eventually(t, "the replayed message handled", func() bool {
		return strings.Contains(w.log.String(), `resume replayed missed events before RESUMED" component=discord platform=discord component=discordgo first=MESSAGE_CREATE`)
	})

	// The backfill ends before RESUMED; then the replay's deletion of the message comes.
	close(hold)
	eventually(t, "the backfill's end", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	w.srv.Delete(gone.ID)
	release()
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "after", MentionBot: true})
	w.replyTo(t, channelID, after.ID)
	if got, want := w.answered(channelID), append(asked, after.ID); !slices.Equal(got, want) {
		t.Errorf("replies answer %v, want %v (not the message deleted in the replay)", got, want)
	}
	if _, ok := w.stored(t, channelID, gone.ID); ok {
		t.Errorf("the message %s deleted in the replay was taken", gone.ID)
	}
	for _, texts := range a.ran() {
		if slices.Contains(texts, "never mind") {
			t.Errorf("agent runs = %q, want none of the deleted message", a.ran())
			break
		}
	}
	if w.srv.Resumes() == 0 {
		t.Error("the gateway session was not resumed")
	}
}

// TestReplayCutShortByALostConnectionKeepsItsHold: a RESUME's replay in flight (RESUMED not
// come yet) holds a message said while the bot was disconnected; the connection is lost again
// before RESUMED, and the message is deleted meanwhile. The hold is kept across the loss, and
// the next RESUME's replay, which brings the deletion, drops the message: it is not taken or
// answered. Before, the loss handed it on at once, its idle session ran it, and the deletion
// came too late.
func TestReplayCutShortByALostConnectionKeepsItsHold(t *testing.T) {
	w := newWorld(t, echoAgent, nil)
	w.logLevel = slog.LevelDebug // for discordgo's line of a replayed first packet
	w.start(t)
	w.srv.WaitReady(t)
	post := func(text string) *discordgo.Message {
		return w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: text})
	}
	before := post("before")
	w.replyTo(t, dmID, before.ID)
	release := w.srv.WithholdResumed() // of both RESUMEs, until release
	defer release()
	w.srv.Disconnect()
	gone := post("never mind")
	const replayed = `resume replayed missed events before RESUMED" component=discord platform=discord component=discordgo first=`
	eventually(t, "the replayed message handled", func() bool { return strings.Contains(w.log.String(), replayed+"MESSAGE_CREATE") })
	w.srv.Disconnect() // lost again before RESUMED
	w.srv.Delete(gone.ID)
	eventually(t, "the next replay's deletion handled", func() bool { return strings.Contains(w.log.String(), replayed+"MESSAGE_DELETE") })
	release()
	after := post("after")
	w.replyTo(t, dmID, after.ID)
	if got, want := w.answered(dmID), []string{before.ID, after.ID}; !slices.Equal(got, want) {
		t.Errorf("replies answer %v, want %v (not the message deleted before the second replay)", got, want)
	}
	if _, ok := w.stored(t, dmID, gone.ID); ok {
		t.Errorf("the message %s deleted before the second replay was taken", gone.ID)
	}
	if w.srv.Resumes() != 2 || w.srv.Identifies() != 1 {
		t.Errorf("resumes %d, identifies %d: want the gateway session resumed twice", w.srv.Resumes(), w.srv.Identifies())
	}
}
