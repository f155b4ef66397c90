package discord

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestLateEndOfALetGoRunKeepsTheNextReplaysHold: a cluster member lets the gateway go (its
// Run's ctx ends with platforms.ErrLetGo), and the goroutine that hands on what that Run's
// replay held runs late: after the member took the gateway again and its next Run's RESUME
// began to replay a message its sender deleted while the bot was away. That message stays
// held until the deletion reaches it, and is never delivered. Before, the late end of the
// earlier Run's ctx ended the new replay's hold: the message was delivered before its deletion
// (an idle session ran it and answered a message taken back).
func TestLateEndOfALetGoRunKeepsTheNextReplaysHold(t *testing.T) {
	const dm = "300000000000000001"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	h := newHeldDelivery()
	srv := discordtest.New(t) // Discord's heartbeat interval: nothing here waits for a heartbeat, and a short one drops a loaded run's connection (five missed ACKs)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetWithdraw(h.withdraw)

	// The first Run's ctx end waits in the hook until the next Run's replay holds the message.
	entered, goOn, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	first := true
	late := func(end func()) {
		if !first {
			end()
			return
		}
		first = false
		close(entered)
		<-goOn
		end()
		close(finished)
	}
	runEnded.Store(&late)
	t.Cleanup(func() { runEnded.Store(nil) })

	ctx1, letGo := context.WithCancelCause(t.Context())
	done1 := make(chan error, 1)
	go func() { done1 <- p.Run(ctx1, h.deliver) }()
	srv.WaitReady(t)
	letGo(platforms.ErrLetGo) // the lease lost: Run closes the connection and returns
	<-entered
	if err := <-done1; err != nil {
		t.Fatalf("Run: %v", err)
	}

	gone := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "never mind"})
	resumed := srv.WithholdResumed()
	defer resumed()
	ctx2, stop := context.WithCancel(t.Context())
	done2 := make(chan error, 1)
	go func() { done2 <- p.Run(ctx2, h.deliver) }()
	t.Cleanup(func() {
		stop()
		if err := <-done2; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	pollFor(t, "the replay holding the message", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.held) == 1
	})
	close(goOn) // the first Run's ctx end runs now
	<-finished

	srv.Delete(gone.ID)
	resumed()
	after := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "after"})
	pollFor(t, "the delivery of the message after", func() bool { texts, _, _ := h.got(); return slices.Contains(texts, after.Content) })
	if texts, _, _ := h.got(); !slices.Equal(texts, []string{"after"}) {
		t.Errorf("delivered %q, want only %q: the message deleted during the replay was handed on before its deletion", texts, "after")
	}
}
