package discord

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// resendPosts is the route of the posts, and the reads, of resendDM.
const resendPosts = "/channels/" + resendDM + "/messages"

// TestBacklogHeldByARateLimitReadsNothing: replies, or a draft, held back by a rate limit for
// longer than Discord enforces a nonce, were never posted: once the limit ends, they are posted
// without reading the channel. Before, every reply of such a backlog read the channel first (up
// to 5 pages each) once it was a minute old, and so did a draft a minute after its first try.
func TestBacklogHeldByARateLimitReadsNothing(t *testing.T) {
	// The limit (on the real clock) outlasts the held tries' deadline, and ends before the
	// tries after it, which wait for it.
	const limit, held = 3 * time.Second, time.Second
	try := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(t.Context(), held)
		defer cancel()
		return f(ctx)
	}
	t.Run("replies", func(t *testing.T) {
		srv, m := newResendWorld(t)
		p := mustResendPlatform(t, srv)
		srv.RateLimitNext("POST", resendPosts, limit, 1)
		var outs []*platforms.Outbound
		var want []string
		for seq := int64(1); seq <= 3; seq++ {
			out := replyOut(srv, m, fmt.Sprint("answer ", seq))
			out.Seq = seq
			if err := try(func(ctx context.Context) error { return p.Send(ctx, out) }); err == nil {
				t.Fatalf("Send of reply %d under the rate limit = nil, want an error", seq)
			}
			outs, want = append(outs, out), append(want, out.Text)
		}
		srv.Advance(discordtest.NonceWindow + time.Minute)
		for _, out := range outs {
			if err := p.Send(t.Context(), out); err != nil {
				t.Fatalf("Send of reply %d after the limit = %v", out.Seq, err)
			}
		}
		if n := srv.Requests("GET", resendPosts); n != 0 {
			t.Errorf("%d reads of the DM, want none", n)
		}
		if got := sentTexts(srv, resendDM); !slices.Equal(got, want) {
			t.Errorf("the DM shows %q, want %q", got, want)
		}
	})
	t.Run("a draft", func(t *testing.T) {
		srv, m := newResendWorld(t)
		p := mustResendPlatform(t, srv)
		target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: resendDM}
		srv.RateLimitNext("POST", resendPosts, limit, 1)
		if err := try(func(ctx context.Context) error {
			_, err := p.SendDraft(ctx, target, []string{m.ID}, "t1", "the start")
			return err
		}); err == nil {
			t.Fatal("SendDraft under the rate limit = nil error, want one")
		}
		srv.Advance(discordtest.NonceWindow + time.Minute)
		if _, err := p.SendDraft(t.Context(), target, []string{m.ID}, "t1", "the start of it"); err != nil {
			t.Fatalf("SendDraft after the limit = %v", err)
		}
		if n := srv.Requests("GET", resendPosts); n != 0 {
			t.Errorf("%d reads of the DM, want none", n)
		}
		if got := sentTexts(srv, resendDM); !slices.Equal(got, []string{"the start of it"}) {
			t.Errorf("the DM shows %q, want the draft once", got)
		}
	})
}

// TestReplySentAgainReadsItsChannelOnce: a reply the runtime sends again after a restart or a
// hand-over (Again), however recently it was made, may have been posted by the earlier send at
// any time: its channel is read before it is posted, once; a try again within the nonce window
// reads nothing. Before, the reply's age on the clock of the process that made it decided, and
// a reply made less than a minute ago (by a clock that may run ahead) was not looked for.
func TestReplySentAgainReadsItsChannelOnce(t *testing.T) {
	srv, m := newResendWorld(t)
	text := strings.Repeat("a", 1500) + "\n\n" + strings.Repeat("b", 1500)
	out := replyOut(srv, m, text)
	srv.FailNextAfter("POST", resendPosts, 500, 1) // the earlier send's first part: made, answer lost
	if err := mustResendPlatform(t, srv).Send(t.Context(), out); err == nil {
		t.Fatal("Send whose answer is lost = nil, want an error")
	}
	p := mustResendPlatform(t, srv) // the next start
	srv.FailNext("POST", resendPosts, 500, 1)
	if err := p.Send(t.Context(), sentAgain(out)); err == nil {
		t.Fatal("Send again failing = nil, want an error")
	}
	if err := p.Send(t.Context(), sentAgain(out)); err != nil {
		t.Fatalf("Send again = %v", err)
	}
	if n := srv.Requests("GET", resendPosts); n != 1 {
		t.Errorf("%d reads of the DM, want 1", n)
	}
	if got, want := sentTexts(srv, resendDM), Split(text, MaxMessageLen); !slices.Equal(got, want) {
		t.Errorf("the DM shows %d messages %.40q, want the %d parts of the reply once each", len(got), got, len(want))
	}
}

// TestOwnPostTriedAgainPastTheNonceWindowIsNotPostedTwice: a reply whose post this process made
// and got no answer to is tried again later than Discord enforces the nonce: the channel is
// read first, from that post on, whatever the time the outbound says it was made. Before, that
// time decided: one of a clock ahead of the platform's (set back since), or none, read nothing,
// and the reply was posted twice.
func TestOwnPostTriedAgainPastTheNonceWindowIsNotPostedTwice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration // how far ahead of the platform's clock the outbound was made
		none  bool          // the outbound does not say when it was made
	}{
		{name: "made by a clock ahead", ahead: 10 * time.Minute},
		{name: "made at no known time", none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, m := newResendWorld(t)
			p := mustResendPlatform(t, srv)
			out := replyOut(srv, m, "the answer")
			out.CreatedAt = out.CreatedAt.Add(tc.ahead)
			if tc.none {
				out.CreatedAt = time.Time{}
			}
			srv.FailNextAfter("POST", resendPosts, 500, 1)
			if err := p.Send(t.Context(), out); err == nil {
				t.Fatal("Send whose answer is lost = nil, want an error")
			}
			srv.Advance(discordtest.NonceWindow + time.Minute)
			if err := p.Send(t.Context(), out); err != nil {
				t.Fatalf("Send again = %v", err)
			}
			if got := sentTexts(srv, resendDM); !slices.Equal(got, []string{"the answer"}) {
				t.Errorf("the DM shows %q, want the reply once", got)
			}
		})
	}
}

// TestForgottenSendReadsItsChannel: what the platform knows of its sends is bounded; past the
// bound it is forgotten. A send of an outbound made before that, which the platform may have
// posted without an answer, reads its channel first, and is not posted twice; one made after
// reads nothing.
func TestForgottenSendReadsItsChannel(t *testing.T) {
	defer func(n int) { maxProgress = n }(maxProgress)
	maxProgress = 1
	srv, m := newResendWorld(t)
	p := mustResendPlatform(t, srv)
	var outs []*platforms.Outbound
	for seq, text := range []string{"the answer", "another answer"} { // the second's record forgets the first's
		out := replyOut(srv, m, text)
		out.Seq = int64(seq + 1)
		srv.FailNextAfter("POST", resendPosts, 500, 1)
		if err := p.Send(t.Context(), out); err == nil {
			t.Fatalf("Send of reply %d whose answer is lost = nil, want an error", out.Seq)
		}
		outs = append(outs, out)
	}
	srv.Advance(discordtest.NonceWindow + time.Minute)
	for _, out := range outs {
		if err := p.Send(t.Context(), out); err != nil {
			t.Fatalf("Send again of reply %d = %v", out.Seq, err)
		}
	}
	if got := sentTexts(srv, resendDM); !slices.Equal(got, []string{"the answer", "another answer"}) {
		t.Errorf("the DM shows %q, want each reply once", got)
	}
	reads := srv.Requests("GET", resendPosts)
	out := replyOut(srv, m, "a new answer")
	out.Seq = 3
	if err := p.Send(t.Context(), out); err != nil {
		t.Fatalf("Send of a new reply = %v", err)
	}
	if n := srv.Requests("GET", resendPosts) - reads; n != 0 {
		t.Errorf("a reply made after the platform forgot read the DM %d times, want none", n)
	}
}
