package discord

import (
	"slices"
	"testing"
	"time"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestReplySentAgainFromASkewedMemberIsNotPostedTwice: in a cluster, a reply made and posted by
// one member whose answer was lost is sent again by another (Again, after a hand-over) past
// the nonce window. The outbound's CreatedAt is of the first member's clock, which may run
// ahead of Discord's by more than clockSkew: the read for the earlier post starts after the
// message the reply answers, an id Discord assigned, so it finds the post whatever that clock
// said. Before, it started clockSkew before CreatedAt, after the post, and the reply was posted
// twice.
func TestReplySentAgainFromASkewedMemberIsNotPostedTwice(t *testing.T) {
	for _, ahead := range []time.Duration{0, 10 * time.Minute, 24 * time.Hour} {
		t.Run(ahead.String(), func(t *testing.T) {
			srv, m := newResendWorld(t)
			out := replyOut(srv, m, "the answer")
			out.CreatedAt = out.CreatedAt.Add(ahead) // the first member's clock
			srv.FailNextAfter("POST", resendPosts, 500, 1)
			if err := mustResendPlatform(t, srv).Send(t.Context(), out); err == nil {
				t.Fatal("Send whose answer is lost = nil, want an error")
			}
			srv.Advance(discordtest.NonceWindow + time.Minute)
			if err := mustResendPlatform(t, srv).Send(t.Context(), sentAgain(out)); err != nil {
				t.Fatalf("Send again on another member = %v", err)
			}
			if got := sentTexts(srv, resendDM); !slices.Equal(got, []string{"the answer"}) {
				t.Errorf("the DM shows %q, want the reply once", got)
			}
		})
	}
}
