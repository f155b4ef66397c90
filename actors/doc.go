// Package actors is agentgate's session runtime on protoactor-go. Every conversation session is
// an actor that owns its identity, its pending queue and its transcript buffer, so a turn can
// only ever run with the identity of its own session and triggering message.
//
// The actors, with their parents and the messages they handle:
//
//   - SessionManager (top level, "sessions"): Routed, Drain, ListActive, Leave, Forward (from a
//     leaving member's manager; one of a kind it does not know, from a newer member, is
//     answered Unsupported), and from its sessions
//     passivate, busyChanged, stopped, SessionState (a session started while its member leaves
//     has loaded), and its own idleSweep tick. Routes by session key, spawns sessions on demand, stops
//     idle ones, supervises them one for one with a restart budget, and re-activates sessions
//     with unfinished durable work at start. While its member leaves the cluster it forwards
//     what it no longer runs to each key's successor.
//   - Session (child of SessionManager, named by its key): Deliver, GetState, ResetSession,
//     RequeueMessage, Withdraw
//     (protobuf, messages.proto), TurnFinished, turnPanicked and slotTaken from its Turn,
//     persistence.WriteResult and persistence.WritesTaken (a held turn result is tried again
//     at once), idleCheck from the manager's idle sweep (passivation),
//     leaving when its member leaves the cluster, draining when the manager is asked to drain
//     (a held turn result is tried again at once), and probationGranted and probationLost from
//     Probation.
//     Acknowledges a message only once it is durable.
//   - Probation (top level, "probation"; a single daemon's only): askProbation and endProbation
//     from sessions, Terminated of the sessions it watches, and its own waitsDue tick (the
//     limited line of the sessions that began to wait). Grants its one token in request
//     order to sessions whose next message is a suspect (the daemon's unclean stops counted
//     against it ProbationAfter times; probationGranted), so that suspects run one at a time.
//   - Turn (top level, "turn-<n>", spawned by a Session): runTurn (and startAgent when it must
//     wait for its head's mark), then runs one agent call in a
//     goroutine it owns, and a relay goroutine that hands steered messages to the agent; the
//     session cancels it by stopping it. A panic in the agent is handed to the session, which
//     re-raises it and restarts (G5).
//   - Platform (top level, "platform-<name>"): StartIntake, SendOutbound, and for a
//     platforms.Editor DraftText (from a turn's Request.Partial), FinishDraft and DropDraft.
//     Runs a platform's inbound loop with capped backoff and delivers outbound messages in order
//     per session key, confirming each delivery in the outbox; posts and edits the drafts of
//     streaming turns in the same per-key order.
//
// Intake (not an actor) builds session keys for inbound messages and asks sessions through a
// SessionRouter; LocalRouter routes through the SessionManager.
//
// Receive never blocks on the network or an agent; the only I/O inside Receive is a session's
// snapshot read from the store when it starts. This package must not import supervisor or cmd.
package actors
