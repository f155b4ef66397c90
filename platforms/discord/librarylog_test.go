package discord_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms/discord"
)

// TestLibraryLogsNeverCarryTheToken: a line of discordgo's that holds the bot token (at
// LogDebug it logs the identify packet it sends) reaches the log without it, at any level.
func TestLibraryLogsNeverCarryTheToken(t *testing.T) {
	const token = "MTIz.secret-bot-token.XYZ"
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := discord.New(discord.Config{Token: token, Logger: log}); err != nil {
		t.Fatal(err)
	}
	for _, level := range []int{discordgo.LogError, discordgo.LogWarning, discordgo.LogInformational, discordgo.LogDebug} {
		discordgo.Logger(level, 0, "Identify Packet: \n%#v", map[string]any{"op": 2, "d": map[string]string{"token": "Bot " + token}})
	}
	got := logs.String()
	if strings.Count(got, "Identify Packet") != 4 {
		t.Fatalf("the library's lines did not all reach the log:\n%s", got)
	}
	if strings.Contains(got, token) || strings.Contains(got, "secret-bot-token") {
		t.Errorf("the bot token reached the log:\n%s", got)
	}
	if strings.Contains(got, "level=ERROR") || strings.Count(got, "level=WARN") != 2 {
		t.Errorf("discordgo's errors and warnings are not both WRN lines:\n%s", got)
	}
}

// TestResumeReplayIsNoWarning: Discord answers a RESUME with the events the connection missed
// before RESUMED, and discordgo warns of the first one with a dump of its raw bytes (a user's
// message and all). The soak of the binary against the fake Discord logged such a WRN line of
// several KB at every resume; it is a one-line debug line naming the event, and no user's
// message reaches the log.
func TestResumeReplayIsNoWarning(t *testing.T) {
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := discord.New(discord.Config{Token: "tok", Logger: log}); err != nil {
		t.Fatal(err)
	}
	e := &discordgo.Event{Operation: 0, Sequence: 41, Type: "MESSAGE_CREATE", RawData: []byte(`{"content":"my secret plans"}`)}
	// discordgo's own call, wsapi.go (v0.29.0), after a RESUME whose first answer is a replay.
	discordgo.Logger(discordgo.LogWarning, 0, "Expected READY/RESUMED, instead got:\n%#v\n", e)
	got := logs.String()
	if strings.Contains(got, "level=WARN") || !strings.Contains(got, "level=DEBUG") {
		t.Errorf("a replay before RESUMED is not one debug line:\n%s", got)
	}
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, "first=MESSAGE_CREATE") || !strings.Contains(got, "seq=41") {
		t.Errorf("want one line naming the event and its sequence:\n%s", got)
	}
	if strings.Contains(got, "0x") || strings.Contains(got, "secret") {
		t.Errorf("the event's raw bytes reached the log:\n%s", got)
	}
}
