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
// (it treats it as refused too). A sender so refused is told when the store next takes a write
// (WritesTaken).
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

// WritesTaken tells a sender that the actor answered a write it keeps (Write.Keep) refused as
// unavailable that the store has taken a write since (the database or the spool; any sender's):
// the store takes writes again, and the sender may send the refused write again now rather than
// at the end of its pause. It is sent once per refusal, at the first write taken after it; a
// restart of the actor forgets the refusals, and their senders wait out their pauses.
type WritesTaken struct{}

// StoreRecovered tells the actor that its store takes writes again, which it refused without a
// write to show it (a PostgreSQL store took its daemon lock again: postgres.Options.LockTaken):
// the actor tells the senders of the kept writes it refused (WritesTaken) at once, not at the
// next write it takes. Sent by whatever the store calls, never by the store itself.
type StoreRecovered struct{}

// Flush is a durability barrier: the sender gets a *Flushed once everything sent before it is
// committed.
type Flush struct{}

// Flushed answers Flush.
type Flushed struct{}

// flushNow is the token the actor sends itself to commit what has queued up.
type flushNow struct{}

// PullBack asks the persistence actor to set the session times after After to To
// (Store.PullBack), once what was sent before it is committed; the sender gets a *PulledBack.
// While writes wait in the spool it does nothing: they may carry such times, and the next
// PullBack comes after them.
type PullBack struct {
	After, To time.Time
}

// PulledBack answers PullBack with the number of sessions whose times it set.
type PulledBack struct {
	Sessions int
	Err      error
}

// Prune asks the persistence actor for one step of a prune pass (Store.PruneStep): to delete
// sessions that ended before Before (and passed the store's safety checks), or what earlier
// steps left of theirs, in a transaction of at most Rows rows (0: the store's default); the
// sender gets a *Pruned. Running it on the persistence actor keeps it the only writer, and one
// step per request lets the writes sent meanwhile commit between two steps.
type Prune struct {
	Before time.Time
	Rows   int
	// Pass is the sender's number of the pass, returned in Pruned.
	Pass uint64
}

// Pruned answers Prune with what the step deleted (see persistence.PruneCount). More says that
// the step spent its budget: the pass asks for another.
type Pruned struct {
	Pass     uint64
	Sessions int
	Messages int
	Swept    int // outbox rows the step's sweep deleted or emptied (persistence.PruneCount)
	More     bool
	Err      error
}
