package main

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestKilledWhileStreamingLeavesNoHalfAnswer runs the binary with Discord and a streaming model,
// both fakes on loopback: the daemon is killed (SIGKILL) while a reply streams into its draft.
// The next start deletes that half-written draft, and the message, run again, is answered in a
// message of its own: the user is left with one whole answer.
func TestKilledWhileStreamingLeavesNoHalfAnswer(t *testing.T) {
	srv := discordtest.New(t)
	const dm = "300000000000000001"
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	never := make(chan struct{}) // the first stream never gets past its first words
	model := openaitest.New(t, openaitest.Steps(
		openaitest.Stream(never, 10, 5, "Half an ans", "wer that never ends"),
		openaitest.Stream(nil, 10, 5, "The whole ", "answer."),
	))
	dataDir := t.TempDir()
	env := []string{
		"AGENTGATE_PLATFORMS_DISCORD_ENABLED=true", "AGENTGATE_PLATFORMS_DISCORD_API_URL=" + srv.APIURL(),
		"DISCORD_TOKEN=" + srv.Token(),
		"AGENTGATE_AGENT_BACKEND=openai", "AGENTGATE_AGENT_OPENAI_BASE_URL=" + model.URL(),
		"AGENTGATE_AGENT_OPENAI_MODEL=test-model", "AGENTGATE_AGENT_OPENAI_API_KEY_ENV=E2E_MODEL_KEY", "E2E_MODEL_KEY=sk-test",
	}
	d := MustServe(t, dataDir, env...)
	srv.WaitReady(t)
	srv.Post(discordtest.UserMessage{ChannelID: dm, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "tell me"})
	draft := srv.WaitSent(t, dm, 1)[0]
	if draft.Content != "Half an ans" {
		t.Fatalf("draft = %q, want the first words of the stream", draft.Content)
	}
	waitFor(t, 30*time.Second, func() bool { return openDrafts(t, dataDir) == 1 }) // its record is durable
	d.kill(t)

	d = MustServe(t, dataDir, env...)
	srv.WaitReady(t)
	waitFor(t, 30*time.Second, func() bool { // 3-5 s seen under a loaded machine
		sent := srv.Sent(dm)
		return slices.Contains(srv.DeletedByBot(), draft.ID) && len(sent) == 1 && sent[0].Content == "The whole answer."
	})
	// The record is closed once the platform actor hears that the draft is deleted, a step
	// after the deletion: a stop in between (a loaded host) leaves it open, and the next
	// start deletes it again (Discord's unknown message counts as deleted) and closes it.
	waitFor(t, 30*time.Second, func() bool { return openDrafts(t, dataDir) == 0 })
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
	if n := openDrafts(t, dataDir); n != 0 {
		t.Errorf("%d draft records left open, want 0", n)
	}
	if model.Count() != 2 {
		t.Errorf("the model was asked %d times, want 2 (the killed turn, then its rerun)", model.Count())
	}
}

// openDrafts counts the Discord draft records of the data directory's database.
func openDrafts(t *testing.T, dataDir string) int {
	t.Helper()
	st, err := sqlite.OpenReadOnly(t.Context(), filepath.Join(dataDir, "agentgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ds, err := st.OpenDrafts(t.Context(), "discord", 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(ds)
}
