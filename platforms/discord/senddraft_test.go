package discord

import (
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestDraftFoundByItsKeyShowsTheNewText: a draft post whose answer was lost (Discord posted
// it, then answered 500) is found by the next SendDraft with the same key, and that SendDraft's
// text is what it shows: here the interrupted mark of a turn cancelled meanwhile. Before, the
// draft found kept the text of the try that posted it, part of an answer without its mark
// (found by TestHuntDrafts).
func TestDraftFoundByItsKeyShowsTheNewText(t *testing.T) {
	const dm = "300000000000000001"
	srv, p, target := draftPostedAnswerLost(t, dm, "half an answer")
	const marked = "half an answer" + platforms.InterruptedMark
	id, err := p.SendDraft(t.Context(), target, nil, "t1", marked)
	if err != nil {
		t.Fatalf("SendDraft again = %v", err)
	}
	sent := srv.Sent(dm)
	if len(sent) != 1 || sent[0].ID != id || sent[0].Content != marked {
		var got []string
		for _, m := range sent {
			got = append(got, m.ID+": "+m.Content)
		}
		t.Errorf("the DM shows %q, want draft %s alone, showing %q", got, id, marked)
	}
}

// TestDraftFoundButNotShownReturnsItsID: a SendDraft that finds the draft an earlier try
// posted (its answer lost) but whose edit to show the new text fails returns the draft's id
// with its error: the draft is made, and the runtime records it so the next start deletes it.
// Before, the id was dropped, and a stop whose last tries failed so left the draft in the chat
// with no record, showing part of an answer (found by TestHuntDrafts, seed 71017).
func TestDraftFoundButNotShownReturnsItsID(t *testing.T) {
	const dm = "300000000000000001"
	srv, p, target := draftPostedAnswerLost(t, dm, "half")
	sent := srv.Sent(dm)
	if len(sent) != 1 {
		t.Fatalf("the DM shows %d messages, want the draft", len(sent))
	}
	srv.FailNext("PATCH", "/channels/"+dm+"/messages/"+sent[0].ID, 500, 1)
	id, err := p.SendDraft(t.Context(), target, nil, "t1", "half an answer")
	if err == nil || id != sent[0].ID {
		t.Errorf("SendDraft finding the draft, its edit failing = %q, %v; want %q with an error", id, err, sent[0].ID)
	}
}

// draftPostedAnswerLost returns a platform on a fake Discord with the DM dm, in which a draft
// of turn t1 showing text was posted and its answer lost (SendDraft failed).
func draftPostedAnswerLost(t *testing.T, dm, text string) (*discordtest.Server, *Platform, identity.Source) {
	t.Helper()
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}
	srv.FailNextAfter("POST", "/channels/"+dm+"/messages", 500, 1)
	if _, err := p.SendDraft(t.Context(), target, nil, "t1", text); err == nil {
		t.Fatal("SendDraft whose answer is lost = nil error, want one")
	}
	return srv, p, target
}
