package config

import (
	"strings"
	"testing"
	"time"
)

// TestValidateRefusesDiscordShardsInACluster: a cluster holds one Discord gateway connection for
// the bot (the lease gateway/discord), so a shard_count above 1 there is refused, with what to
// do instead. Before, it was taken, and only one shard's guilds were heard, on whichever member
// held the lease.
func TestValidateRefusesDiscordShardsInACluster(t *testing.T) {
	c := Default()
	c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
	c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: "10.0.0.5:6340", MemberTTL: 6 * time.Second}
	c.Platforms.Discord.Enabled, c.Platforms.Discord.ShardCount = true, 2
	err := c.Validate()
	want := "platforms.discord.shard_count: 2: must be 1 with cluster.enabled"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "one daemon per shard_id") {
		t.Errorf("Validate() = %v, want %q and what to do instead", err, want)
	}
}
