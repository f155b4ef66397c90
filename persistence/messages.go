package persistence

import "time"

// Messages received by the persistence actor (Actor.Receive).

// Write asks the persistence actor to commit Ops atomically. The sender gets a *WriteResult with
// the same ID once the write is committed or has failed. Senders keep a write until it is
// acknowledged and may re-send it (every Op is idempotent).
//
// A restart of the persistence actor loses the writes it had collected, and a sender's later
// writes, already in its mailbox, would commit ahead of them. A sender that keeps its writes in
// order (a session) sets Incarnation to the actor's incarnation (ActorOptions.Incarnation) when
// it sends, and After when earlier writes of its own are still unacknowledged. The actor refuses
// a write with After set that was sent to an earlier incarnation (ErrResend): the sender sends
// its unacknowledged writes again, in order, and this one after them. A sender that sees the
// incarnation grow past the one its unacknowledged writes were sent to does the same before
// it sends anything newer.
//
// Nor does a write commit ahead of one of its sender's that the actor refused as unavailable
// and that the sender keeps, to send it again (Keep: a session's turn result): a write with
// After set is refused so too (ErrUnavailable), until the sender sends one without After,
// having heard the answers of every write it made before that one. A restart forgets such
// refusals: a sender that keeps a refused write does not send again a write it sent behind it
// (it treats it as refused too).
type Write struct {
	ID          uint64
	Ops         []Op
	Incarnation uint64
	After       bool
	Keep        bool
}

// WriteResult acknowledges a Write. Err is nil when the write is durable.
type WriteResult struct {
	ID  uint64
	Err error
}

// Flush is a durability barrier: the sender gets a *Flushed once everything sent before it is
// committed.
type Flush struct{}

// Flushed answers Flush.
type Flushed struct{}

// flushNow is the token the actor sends itself to commit what has queued up.
type flushNow struct{}

// Prune asks the persistence actor to delete sessions that ended before Before (and passed the
// store's safety checks); the sender gets a *Pruned. Running it on the persistence actor keeps
// it the only writer.
type Prune struct {
	Before time.Time
	Limit  int
}

// Pruned answers Prune.
type Pruned struct {
	Sessions int
	Err      error
}
