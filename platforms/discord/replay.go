package discord

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms"
)

// On RESUME, Discord replays the events the connection missed, in order, and then sends
// RESUMED. A message said and deleted (or edited) while the bot was disconnected comes back as
// its MESSAGE_CREATE with its MESSAGE_DELETE (MESSAGE_UPDATE) after it: taken at its CREATE,
// the message of an idle session started its turn at once, the deletion came too late (a
// running turn is answered), and the bot answered a message its sender had deleted, or what it
// said before its edit. So while a replay is in flight, from the RESUME sent until RESUMED, the
// messages it creates wait in held, as live messages wait during a backfill; the replayed
// deletions drop them (withdrawDeleted) and the edits rewrite them (onMessageUpdate), and
// RESUMED hands the rest to the runtime in order. A connection lost before RESUMED (or an Open
// that fails) keeps the hold: discordgo keeps its gateway session, and the next RESUME replays
// from the last event handled, with the deletions and edits of what is held. Handed on at the
// loss, an idle session ran a message deleted before the next replay. The hold ends otherwise
// too (INVALID_SESSION and a new IDENTIFY's READY, a refusal for good, a stop), and nothing
// held is dropped. A cluster member that lets the gateway go (platforms.ErrLetGo: its connection
// lost, or its lease) keeps the hold as a lost connection does, for letGoHold at most once its
// next Run is due (RunDue): that Run RESUMEs, unless another member took the gateway, whose
// READY reads back the chats it knows and not what this member holds. discordgo resumes whenever it has a gateway session,
// that is after the first READY, for as long as the Platform lives.

// maxReplayHeld bounds the messages a replay holds (a var: tests lower it). Past it, what is
// held is handed on, in order, and the message after it with it, as without the hold: a long
// disconnect's replay is not kept in memory whole, and its messages are not answered late.
var maxReplayHeld = 1000

// beginReplay starts the hold of a replay, if the connection Open is about to make resumes a
// gateway session (it sends RESUME, not IDENTIFY).
func (p *Platform) beginReplay() {
	p.mu.Lock()
	p.replaying = p.resumable
	p.mu.Unlock()
}

// endReplay ends the hold of a replay and hands what it holds to the intake (intake.go), in
// order: at RESUMED, at the READY of a new gateway session, at a refusal for good, when Run's
// ctx ends for a stop (Run, settle), letGoHold after a let-go (endReplayOf). While a backfill
// runs, the held messages are left to it: it hands them on after its own, in order, unless a
// replay is in flight again when it is done, whose end hands them on.
func (p *Platform) endReplay() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endReplayLocked()
}

// runEnded, when set, is called with the end of a Run's ctx's hand-on of a replay's hold
// (endReplayOf), to run it (tests: a goroutine that runs late).
var runEnded atomic.Pointer[func(end func())]

// letGoHold bounds how long a replay's hold outlives a Run whose ctx ended with
// platforms.ErrLetGo (a cluster member let the gateway go: its connection lost, or its lease),
// from the moment the member's next Run is due (RunDue: its gateway wrapper begins to wait for
// the lease). Handed on at once, the hold never outlived a lost connection in a cluster, and a
// deletion the member's next RESUME replayed came after the delivery: the bot answered a
// message taken back. Kept until the member's next READY or stop, the messages of a chat no
// read-back finds (a new DM) sat for hours when another member took the lease: its READY reads
// back the other chats, deleted messages gone. 30 s covers the lease's turn (its checks every
// 2 s, a dead holder's freed in 10 s), and answers such a message at most that much after the
// member began to wait for it. Counted from the let-go, it covered the platform actor's backoff
// before that wait too, and a backoff past 30 s (32 s and 1 min, a streak's sixth try on) handed
// the hold on before the next Run, whose RESUME replayed the deletions after the delivery
// (TestLetGoHoldOutlivesALongBackoff).
const letGoHold = 30 * time.Second

// letGoHoldMost bounds the hold of a let-go whose next Run is never said to be due (RunDue):
// a wrapper that does not say it. It covers the platform actor's longest backoff (1 min) and
// letGoHold after it.
const letGoHoldMost = 2 * time.Minute

// letGoWait, when set, replaces time.After for the waits of letGoHold and letGoHoldMost (tests
// drive them).
var letGoWait atomic.Pointer[func(time.Duration) <-chan time.Time]

// letGoAfter returns time.After, or letGoWait when a test set it.
func letGoAfter() func(time.Duration) <-chan time.Time {
	if f := letGoWait.Load(); f != nil {
		return *f
	}
	return time.After
}

// RunDue tells the platform that its next Run is due and waits only for what gates it: a
// cluster member's gateway wrapper calls it as it begins to wait for the gateway lease, after
// the platform actor's backoff. What the replay of a Run that let the gateway go holds waits
// for that Run letGoHold from now at most (keepLetGoHoldLocked), not from the let-go.
func (p *Platform) RunDue() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.letGoDue != nil {
		p.letGoDue <- letGoAfter()(letGoHold) // buffered: the wait takes it
		p.letGoDue = nil
		return
	}
	p.dueAfter = p.runs // before the end of the let-go Run's ctx was handled (endReplayOf)
}

// endReplayOf ends the hold of a replay as endReplay does, when Run's ctx ends with cause,
// unless a later Run than run has started: the hold is then that Run's (its RESUME's), which
// its own end, RESUMED or READY hands on. The ctx of a cluster member's Run ends once the Run
// has returned (platforms.ErrLetGo), and the AfterFunc that hands the hold on runs on its own
// goroutine: run late, past the next Run's RESUME, it handed that replay's messages on before
// the deletions and edits the replay brought after them. A let-go keeps a replay's hold for
// letGoHold (keepLetGoHoldLocked); a stop hands it on at once.
func (p *Platform) endReplayOf(run int, cause error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runs != run {
		return
	}
	if p.replaying && errors.Is(cause, platforms.ErrLetGo) && p.runCtx.Err() == nil {
		p.keepLetGoHoldLocked(run)
		return
	}
	p.endReplayLocked()
}

// keepLetGoHoldLocked keeps the hold of run's replay after its ctx ended with
// platforms.ErrLetGo, until the next Run starts (its RESUME replays the rest, and its RESUMED,
// READY or refusal hands the hold on), a stop hands it on (settle), or letGoHold passes after
// that Run is due (RunDue), or letGoHoldMost after the let-go; either hands it on. p.mu is held.
func (p *Platform) keepLetGoHoldLocked(run int) {
	after := letGoAfter()
	p.endLetGoWaitLocked()
	most := after(letGoHoldMost)
	var bound <-chan time.Time
	due := make(chan (<-chan time.Time), 1)
	if p.dueAfter == run {
		bound = after(letGoHold) // RunDue came first
	} else {
		p.letGoDue = due
	}
	next := make(chan struct{})
	p.letGoHeld = next
	stopped := p.runCtx.Done()
	go func() {
		for {
			select {
			case bound = <-due:
				due = nil
				continue
			case <-bound:
			case <-most:
			case <-next: // the next Run's replay has the hold
				return
			case <-stopped: // the stop handed it on
				return
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.runs != run {
				return // the next Run started as the bound passed: its replay has the hold
			}
			if len(p.held) > 0 {
				p.log.Debug("discord replay's hold handed on: the gateway was not taken again in time", "held", len(p.held))
			}
			p.endReplayLocked()
			return
		}
	}()
}

// endLetGoWaitLocked ends the wait of an earlier Run's let-go for its hold
// (keepLetGoHoldLocked): the Run starting now has it. p.mu is held.
func (p *Platform) endLetGoWaitLocked() {
	p.letGoDue = nil // a RunDue from now on is of the next let-go's
	if p.letGoHeld != nil {
		close(p.letGoHeld)
		p.letGoHeld = nil
	}
}

// endReplayLocked is endReplay with p.mu held.
func (p *Platform) endReplayLocked() {
	p.replaying = false
	if p.backfills > 0 {
		return
	}
	held := p.held
	p.held = nil
	p.enqueueLocked(held...)
}

// onMessageUpdate applies an edit to a message held (of a replay or during a backfill), queued
// for the intake or read back by a backfill and not yet handed on: it is answered as its sender
// left it. An update that is no edit (an
// embed unfurled: no edited_timestamp, no content) changes nothing; nor does the edit of a
// message the intake has taken already, whose delivery is under way or whose turn is queued or
// done.
func (p *Platform) onMessageUpdate(_ *discordgo.Session, u *discordgo.MessageUpdate) {
	if u.Message == nil || u.EditedTimestamp == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range p.held {
		p.held[i] = edited(m, u)
	}
	for i, it := range p.intake {
		if it.m != nil {
			p.intake[i].m = edited(it.m, u)
		}
	}
	for i, m := range p.backlog {
		p.backlog[i] = edited(m, u)
	}
}

// edited is m as the edit u leaves it, if u edits m; m itself otherwise.
func edited(m *discordgo.Message, u *discordgo.MessageUpdate) *discordgo.Message {
	if m.ID != u.ID || m.ChannelID != u.ChannelID {
		return m
	}
	e := *m // a copy: the held message may be shared with discordgo's state
	e.Content, e.EditedTimestamp = u.Content, u.EditedTimestamp
	if u.Mentions != nil {
		e.Mentions = u.Mentions
	}
	if u.MentionRoles != nil {
		e.MentionRoles = u.MentionRoles
	}
	if u.Attachments != nil {
		e.Attachments = u.Attachments
	}
	return &e
}
