// Package discord is agentgate's Discord platform: one gateway connection (a shard) of
// github.com/bwmarrin/discordgo and its REST client.
//
// Inbound, it decides before anything is queued which messages the bot answers (mentions,
// free-response channels, allowlists, bots), maps DMs, guild channels and threads to session
// identities (the guild is the scope; an auto-threaded mention is keyed by the thread it opens)
// and hands each message to the runtime in gateway order: the gateway's reader only queues it, and
// one goroutine, the intake (intake.go), hands the queue on. Outbound, it splits replies at
// Discord's 2,000 characters without breaking code fences, references the triggering message,
// runs a typing indicator while turns work, and posts with nonces Discord enforces so a retry
// never posts twice (one later than Discord holds a nonce looks in the channel first:
// resend.go). A dropped connection ends Run; the platform supervisor reopens it and
// discordgo resumes the gateway session, so Discord replays what was missed; after a restart,
// or when Discord refuses the resume, the platform reads what was missed from the channels'
// history (backfill.go).
//
// Package discordtest is a fake Discord for tests of this package and the daemon.
package discord
