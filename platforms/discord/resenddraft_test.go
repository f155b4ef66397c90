package discord

import (
	"slices"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestDraftPostedAgainPastTheNonceWindowIsNotPostedTwice: a draft whose post Discord made but
// whose answer was lost is tried again, with the same key, until a try succeeds: through an
// outage, later than Discord enforces the nonce, and with the text the turn has streamed
// meanwhile. Before, that try made a second draft, and the first stayed in the chat for good,
// showing the start of the answer, never finished nor marked; now the try finds the first in
// the channel and makes it show the new text.
func TestDraftPostedAgainPastTheNonceWindowIsNotPostedTwice(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failed   bool // a try failed before the one whose answer was lost
		readFail bool // the first read of the channel fails
	}{
		{"the next try", false, false},
		{"a later try's post", true, false},
		{"after a failed read", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, m := newResendWorld(t)
			p := mustResendPlatform(t, srv)
			target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}
			in := []string{m.ID}
			if tc.failed {
				srv.FailNext("POST", "/channels/"+resendDM+"/messages", 500, 1)
				if _, err := p.SendDraft(t.Context(), target, in, "t1", "the"); err == nil {
					t.Fatal("SendDraft failing = nil error, want one")
				}
				srv.Advance(30 * time.Second)
			}
			srv.FailNextAfter("POST", "/channels/"+resendDM+"/messages", 500, 1)
			if _, err := p.SendDraft(t.Context(), target, in, "t1", "the start"); err == nil {
				t.Fatal("SendDraft whose answer is lost = nil error, want one")
			}
			srv.Advance(discordtest.NonceWindow + time.Minute)
			if tc.readFail {
				srv.FailNext("GET", "/channels/"+resendDM+"/messages", 500, 1)
				if _, err := p.SendDraft(t.Context(), target, in, "t1", "the start of it"); err == nil {
					t.Fatal("SendDraft whose read fails = nil error, want one")
				}
				if n := len(srv.Sent(resendDM)); n != 1 {
					t.Fatalf("the DM shows %d messages after a failed read, want the draft alone", n)
				}
			}
			id, err := p.SendDraft(t.Context(), target, in, "t1", "the start of the answer")
			if err != nil {
				t.Fatalf("SendDraft again = %v", err)
			}
			sent := srv.Sent(resendDM)
			if got := sentTexts(srv, resendDM); len(sent) != 1 || sent[0].ID != id || !slices.Equal(got, []string{"the start of the answer"}) {
				t.Errorf("the DM shows %q, want draft %s alone, showing the new text", got, id)
			}
		})
	}
}

// TestDraftPostedAgainPastTheNonceWindowIsPosted: a draft tried again past the nonce window
// whose earlier tries made nothing is posted: the bot's message with the same text that answers
// another message is not taken for it, nor is one with another text that answers the same one.
// Within the window, a try reads nothing.
func TestDraftPostedAgainPastTheNonceWindowIsPosted(t *testing.T) {
	srv, m := newResendWorld(t)
	p := mustResendPlatform(t, srv)
	target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}
	other := srv.Post(discordtest.UserMessage{ChannelID: resendDM, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "again"})
	if _, err := p.SendDraft(t.Context(), target, []string{other.ID}, "t0", "the start"); err != nil {
		t.Fatalf("SendDraft of another draft = %v", err)
	}
	if _, err := p.SendDraft(t.Context(), target, []string{m.ID}, "t2", "another start"); err != nil {
		t.Fatalf("SendDraft of another draft = %v", err)
	}
	srv.FailNext("POST", "/channels/"+resendDM+"/messages", 500, 1)
	if _, err := p.SendDraft(t.Context(), target, []string{m.ID}, "t1", "the start"); err == nil {
		t.Fatal("SendDraft failing = nil error, want one")
	}
	srv.FailNext("POST", "/channels/"+resendDM+"/messages", 500, 1)
	srv.Advance(nonceWindow - time.Second)
	if _, err := p.SendDraft(t.Context(), target, []string{m.ID}, "t1", "the start"); err == nil {
		t.Fatal("SendDraft failing = nil error, want one")
	}
	if n := srv.Requests("GET", ""); n != 0 {
		t.Errorf("%d reads within the nonce window, want none", n)
	}
	srv.Advance(discordtest.NonceWindow + time.Minute)
	id, err := p.SendDraft(t.Context(), target, []string{m.ID}, "t1", "the start")
	if err != nil {
		t.Fatalf("SendDraft again = %v", err)
	}
	sent := srv.Sent(resendDM)
	if len(sent) != 3 || sent[2].ID != id || sent[2].MessageReference == nil || sent[2].MessageReference.MessageID != m.ID {
		t.Errorf("the DM shows %q, want the other drafts and a new one answering %s", sentTexts(srv, resendDM), m.ID)
	}
}

// TestDraftInProgressOutlivesTheBound: what the platform knows of drafts tried without an
// answer is bounded (maxProgress); past the bound, the draft tried longest ago is forgotten. A
// draft still being tried keeps its record, although its first try is older than a forgotten
// one's, and a try of it past the nonce window finds the draft its first try made. Before, the
// bound forgot every draft at once, and that try posted a second draft.
func TestDraftInProgressOutlivesTheBound(t *testing.T) {
	defer func(n int) { maxProgress = n }(maxProgress)
	maxProgress = 2
	srv, m := newResendWorld(t)
	p := mustResendPlatform(t, srv)
	target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}
	in := []string{m.ID}
	try := func(key, text string, fail func()) {
		t.Helper()
		fail()
		if _, err := p.SendDraft(t.Context(), target, in, key, text); err == nil {
			t.Fatalf("SendDraft(%s) failing = nil error, want one", key)
		}
		srv.Advance(10 * time.Second)
	}
	lost := func() { srv.FailNextAfter("POST", resendPosts, 500, 1) } // made, its answer lost
	failed := func() { srv.FailNext("POST", resendPosts, 500, 1) }
	try("t1", "one", lost)       // the draft in progress: made
	try("t0", "stale", lost)     // a draft never tried again
	try("t1", "one two", failed) // tried again since
	try("t2", "another", lost)   // past the bound: t0 is forgotten
	srv.Advance(discordtest.NonceWindow + time.Minute)
	id, err := p.SendDraft(t.Context(), target, in, "t1", "one two three")
	if err != nil {
		t.Fatalf("SendDraft(t1) again = %v", err)
	}
	sent := srv.Sent(resendDM)
	if got, want := sentTexts(srv, resendDM), []string{"one two three", "stale", "another"}; len(sent) != 3 || sent[0].ID != id || !slices.Equal(got, want) {
		t.Errorf("the DM shows %q, want %q, the first being draft %s", got, want, id)
	}
}
