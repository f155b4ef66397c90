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
