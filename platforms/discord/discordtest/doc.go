// Package discordtest runs a fake Discord (REST API and gateway websocket) on 127.0.0.1 so
// that tests can drive the real discordgo client, and the adapter built on it, without the
// network. New starts a Server; Client returns an *http.Client that rewrites discordgo's
// EndpointAPI onto it; the gateway URL is learned from GET gateway, as on Discord.
//
// The fake follows Discord where tests can tell: HELLO, IDENTIFY, READY, heartbeats, RESUME
// with replay of every dispatch the client missed, sequence numbers, close codes, intents
// (including the MESSAGE_CONTENT redaction), JSON error bodies with Discord's codes, rate-limit
// headers, nonce deduplication (for NonceWindow) and the 2000-character limit. It models one
// bot, one gateway session at a time and only the routes listed on Server. IDs and timestamps
// come from a fake clock, so two runs of a test see the same values; Advance moves it on.
//
// Concurrency: every Server method is safe to call from any goroutine, except the ones that
// take a testing.TB and may fail the test (WaitFor, WaitSent, WaitReady), which belong on the
// test's goroutine. Each gateway connection has a reader goroutine (the HTTP handler) and a
// writer goroutine; both end before the Server's t.Cleanup returns.
//
// This package imports only the standard library, discordgo and gorilla/websocket: never
// agentgate's own packages, so that any of them may use it in tests.
package discordtest
