package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Streaming drafts. When a session's platform is a platforms.Editor, the session gives its
// turn's agent a Request.Partial that sends the growing reply to the platform actor (DraftText).
// The platform actor posts a draft with the first non-empty text, edits it as the text grows (at
// most once per DraftInterval per turn, the latest text winning), and attaches the draft's id
// to the turn's final outbound (reply, or the notice of a failed turn), which the platform
// then edits into the final text. A cancelled turn's draft is marked interrupted and never
// finished with a reply. So is the draft of a turn whose session crashed or handed over (the
// session drops it as it stops the turn: the message runs again and answers anew, or is
// quarantined and never does); a draft of an earlier turn still here when the key's next turn
// streams is marked then (a re-sent reply of an older turn says nothing about which turn runs
// now, so it does not count). A draft is forgotten once it shows its final text or its mark, so
// the platform actor holds only the drafts of turns in progress.
//
// A draft lives in the platform actor's memory, and a record of it in the store (OpenDraft
// once posted, CloseDraft once finished or shown interrupted, through the queue of the delivery
// marks): when the process dies, the next start deletes the drafts earlier runs left open
// (removeOldDrafts), since their messages run again and answer anew, and the final replies
// re-sent from the outbox are posted anew. A draft posted just before the process died, whose
// record was not written yet, stays.

// DefaultDraftInterval is the least time between two edits of one turn's draft.
const DefaultDraftInterval = time.Second

// InterruptedMark ends the text of a draft whose turn was cancelled or crashed.
const InterruptedMark = platforms.InterruptedMark

// maxMarkTries is how many tries the edit that marks a cancelled turn's draft interrupted
// gets: maxDraftEditFailures a draft interval apart, then with the send backoff (some 2 minutes
// in all). Before, it got maxDraftEditFailures, a few seconds' worth of Discord's failures, and
// the draft stayed showing part of an answer (TestInterruptedDraftWhoseMarkKeepsFailingIsMarked).
const maxMarkTries = 10

// maxDraftEditFailures is how many edits of a draft may fail in a row before it is left alone,
// and how many tries of its post are made at once before the next ones wait with backoff.
const maxDraftEditFailures = 3

// endedTurnsKept bounds how many finished or dropped turns a platform actor remembers, to
// ignore their late draft texts.
const endedTurnsKept = 1024

// finishWait bounds how long a finished turn's draft waits for the turn's final outbound (and
// the key's next draft with it). The session hands the outbound over as soon as its write is
// acknowledged, in milliseconds; one that has not come by then was lost with a session that
// crashed before its write was answered (the message runs again, or its reply is handed over
// again and posted as a message of its own).
const finishWait = 30 * time.Second

// partial returns the Request.Partial of a turn whose platform can edit messages, nil for any
// other. It runs on the agent's goroutine: it only sends to the platform actor.
func (s *Session) partial(c actor.Context, turnID string, group []*item) func(string) {
	src := group[0].src
	pid := s.d.Platforms[src.Platform]
	if pid == nil || !s.d.Editors[src.Platform] {
		return nil
	}
	ids := make([]string, len(group))
	for i, it := range group {
		ids[i] = it.messageID
	}
	root := c.ActorSystem().Root
	target := identity.Source{Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID,
		ThreadID: src.ThreadID, UserID: src.UserID}
	key := s.key
	var mu sync.Mutex
	last := ""
	var shown shownGrowth
	return func(text string) {
		mu.Lock()
		text = shown.of(text) // as the final reply will be
		skip := text == last || strings.TrimSpace(text) == ""
		if !skip {
			last = text
		}
		mu.Unlock()
		if skip {
			return
		}
		root.Send(pid, &DraftText{SessionKey: key, TurnID: turnID, Target: target, InReplyTo: slices.Clone(ids), Text: text})
	}
}

// shownGrowth is shownText of a streaming reply's text, which Request.Partial gets whole each
// time it grows: only what was added since the last call is cleaned, and the text shown so far
// is kept. Cleaned whole at each call, a reply of n bytes streamed a few bytes at a time was
// scanned some n²/8 times over (a 100 KiB reply took seconds of the agent's goroutine, which
// reads the stream, and a megabyte minutes), and once it held one control character each call
// copied it all twice (TestDraftOfALongReplyCostsItsLength). What ends the text without being a
// whole rune (half an emoji, a run of bad bytes) is held back until the text goes on: the draft
// does not show U+FFFD for a character still on its way
// (TestDraftShowsNoControlCharacters/half_a_character); the final reply, cleaned whole
// (finish), shows what is still bad then. A text that does not
// begin with the one before (an agent that took words back) is cleaned anew.
type shownGrowth struct {
	raw   string          // the text cleaned so far: a prefix of the last one, ending with a whole rune
	shown strings.Builder // shownText(raw); the strings it gave out are never written over
}

// of returns the text as a draft shows it: shownText(text) without its unfinished end.
func (g *shownGrowth) of(text string) string {
	if !strings.HasPrefix(text, g.raw) { // (the same bytes most often: no comparison then)
		g.raw = ""
		g.shown = strings.Builder{}
	}
	add := text[len(g.raw):]
	for add != "" {
		if r, size := utf8.DecodeLastRuneInString(add); r != utf8.RuneError || size > 1 {
			break
		}
		add = add[:len(add)-1]
	}
	g.shown.WriteString(shownText(add))
	g.raw = text[:len(g.raw)+len(add)]
	return g.shown.String()
}

// cancelTurn stops a running turn (its agent's context is cancelled) and drops its draft.
func (s *Session) cancelTurn(c actor.Context, r *turnRun) {
	c.Stop(r.pid)
	s.dropDraft(c, r)
}

// cancelAwaited cancels a running turn the conversation moves past (an interrupt, /stop, a
// boundary) and drops its draft; the next turn waits until the cancelled agent call has
// returned (callEnded), so it never overlaps the cancelled command (G2): an exec command has
// SIGTERM, then SIGKILL after its kill grace. The wait is bounded by CancelWait: an agent that
// ignores its cancelled context must not hold the session for ever.
func (s *Session) cancelAwaited(c actor.Context, r *turnRun) {
	c.Send(r.pid, &cancelRun{})
	s.dropDraft(c, r)
	s.giveBackNote(r) // a boundary's new session drops it (newIncarnation)
	stop := s.timers(c).SendOnce(s.d.Config.cancelWait(), c.Self(), &cancelOverdue{TurnID: r.id})
	s.rare().ending = append(s.rare().ending, endingCall{turnID: r.id, stopTimer: stop})
}

// endingCall is a cancelled turn whose agent call has not returned yet (cancelAwaited).
type endingCall struct {
	turnID    string
	stopTimer scheduler.CancelFunc // its cancelOverdue
}

// ending reports whether a cancelled turn's agent call has yet to return (cancelAwaited).
func (s *Session) ending() bool { return s.unusual != nil && len(s.unusual.ending) > 0 }

// onCallEnded takes a cancelled turn's call off the ones the next turn waits for: it has
// returned, or (overdue) the wait for it is over.
func (s *Session) onCallEnded(c actor.Context, turnID string, overdue bool) {
	u := s.unusual
	i := -1
	if u != nil {
		i = slices.IndexFunc(u.ending, func(e endingCall) bool { return e.turnID == turnID })
	}
	if i < 0 {
		return // returned already, or cancelled by an earlier incarnation
	}
	u.ending[i].stopTimer()
	u.ending = slices.Delete(u.ending, i, i+1)
	if overdue {
		s.logger().Warn("the agent call of a cancelled turn has not returned; the next turn starts anyway",
			"turn", turnID, "waited", s.d.Config.cancelWait())
	}
	switch {
	case s.dead:
	case s.fencedOut:
		s.stopWhenSettled(c) // it hands over once the call has returned
	default:
		s.tryStart(c)
	}
}

func (s *Session) dropDraft(c actor.Context, r *turnRun) {
	p := r.items[0].src.Platform
	if pid := s.d.Platforms[p]; pid != nil && s.d.Editors[p] {
		c.Send(pid, &DropDraft{SessionKey: s.key, TurnID: r.id})
	}
}

// finishDraft tells the platform actor of platform that turn has ended and its final outbound
// follows (finish), before the session's next turn can start: that turn streams while the
// result is written, and the ended turn's draft must wait for its reply, not be taken for the
// draft of a crashed turn. Sent again for a result the session holds (keepDrafts), it begins
// the draft's wait anew.
func (s *Session) finishDraft(c actor.Context, platform, turn string) {
	if pid := s.d.Platforms[platform]; pid != nil && s.d.Editors[platform] {
		c.Send(pid, &FinishDraft{SessionKey: s.key, TurnID: turn})
	}
}

// draft is the draft of one turn.
type draft struct {
	key       string
	turn      string
	target    identity.Source
	inReplyTo []string
	id        string    // the platform's id of the draft, once posted
	text      string    // the text it should show
	shown     string    // the text it shows
	lastEdit  time.Time // when the last post or edit went out
	queued    bool      // a post or edit waits in (or runs from) the key's queue
	ticking   bool      // a draftTick is armed
	failed    bool      // the post was refused for good (or maxDraftEditFailures edits failed): no more posts or edits
	broken    bool      // the platform panicked on it: the final reply is posted anew, not edited in
	editFails int       // posts or edits that failed in a row
	stopTries int       // tries of its post made at once as the daemon stops (stopDrafts)
	dropped   bool      // the turn was cancelled: the draft gets its interrupted mark, then is gone
	finishing bool      // the turn has ended: its final outbound is on its way (FinishDraft)
	finishes  int       // the FinishDrafts taken: only the wait the last one began ends the draft (finishOverdue)
	replied   bool      // the turn's final outbound is queued
	after     string    // the key's earlier turn whose draft waits for its reply: posted after it
}

// endedTurns remembers the last endedTurnsKept turns whose drafts are over.
type endedTurns struct {
	set   map[string]bool
	order []string
}

func (e *endedTurns) add(turn string) {
	if e.set == nil {
		e.set = map[string]bool{}
	}
	if e.set[turn] {
		return
	}
	e.set[turn] = true
	e.order = append(e.order, turn)
	if len(e.order) > endedTurnsKept {
		delete(e.set, e.order[0])
		e.order = e.order[1:]
	}
}

func (e *endedTurns) has(turn string) bool { return e.set[turn] }

func (a *Platform) draftInterval() time.Duration {
	if a.d.DraftInterval > 0 {
		return a.d.DraftInterval
	}
	return DefaultDraftInterval
}

// onDraftText takes a running turn's text: the first starts its draft, later ones edit it.
func (a *Platform) onDraftText(c actor.Context, m *DraftText) {
	if _, ok := a.p.(platforms.Editor); !ok || m.TurnID == "" || a.ended.has(m.TurnID) {
		return
	}
	d := a.drafts[m.TurnID]
	if d != nil && d.target == (identity.Source{}) { // the stand-in of a finished turn (onFinishDraft)
		d.target, d.inReplyTo = m.Target, m.InReplyTo
	}
	if d == nil {
		a.abandonDraft(c, m.SessionKey, m.TurnID)
		d = &draft{key: m.SessionKey, turn: m.TurnID, target: m.Target, inReplyTo: m.InReplyTo}
		// The key's previous draft is still here, waiting for its turn's reply (FinishDraft) or
		// its interrupted mark: this one is posted once that one is over, so the chat never shows
		// two drafts in progress.
		if prev := a.drafts[a.liveDraft[m.SessionKey]]; prev != nil && (prev.finishing || prev.dropped) {
			d.after = prev.turn
		}
		a.drafts[m.TurnID] = d
		a.liveDraft[m.SessionKey] = m.TurnID
	}
	d.text = m.Text
	a.scheduleDraft(c, d)
}

// endDraft forgets a draft; later texts of its turn are ignored. The key's next draft, if it
// waits for this one, is scheduled by a draftTick (endDraft may run inside pump). A draft that
// ends while it waits for an earlier one (its turn cancelled before it was posted) hands the
// key back to that one, which the next draft then waits for. Before, the key had no live draft
// left, and the next turn's draft was posted while the earlier one still showed part of an
// answer without its mark: two drafts in progress (TestDraftAfterADroppedWaitingDraftWaits).
func (a *Platform) endDraft(c actor.Context, d *draft) {
	delete(a.drafts, d.turn)
	if a.liveDraft[d.key] == d.turn {
		if prev := a.drafts[d.after]; d.after != "" && prev != nil && prev.key == d.key {
			a.liveDraft[d.key] = d.after
		} else {
			delete(a.liveDraft, d.key)
		}
	}
	a.ended.add(d.turn)
	if next := a.drafts[a.liveDraft[d.key]]; next != nil && next.after == d.turn {
		next.after = ""
		c.Send(c.Self(), &draftTick{turn: next.turn})
	}
}

// abandonDraft marks the draft of an earlier turn of key as interrupted when turn, the turn
// running now, streams: a key runs one turn at a time, so a draft of another turn that is still
// here was never finished (its session crashed, and the message runs again).
func (a *Platform) abandonDraft(c actor.Context, key, turn string) {
	live := a.liveDraft[key]
	if live == "" || live == turn {
		return
	}
	if prev := a.drafts[live]; prev != nil && !prev.dropped && !prev.finishing {
		a.ended.add(live)
		a.interruptDraft(c, prev)
	}
}

// onFinishDraft notes that a turn has ended: its draft waits for the turn's final outbound.
// A turn that streamed no draft gets a stand-in that is never posted, so the key's next
// draft waits for that outbound all the same: the session starts the next turn before the
// ended one's outbound is written and handed over, and the next turn's draft was posted
// above it, a later answer above an earlier one (TestNextDraftWaitsForAReplyWithoutADraft,
// found by TestHuntDrafts). The wait is bounded (finishWait), and a FinishDraft again for the
// same turn begins it anew: the session sends one at each retry of a result the store refused
// and it holds (keepDrafts), whose reply may come long after finishWait.
func (a *Platform) onFinishDraft(c actor.Context, m *FinishDraft) {
	if _, ok := a.p.(platforms.Editor); !ok || m.TurnID == "" || a.ended.has(m.TurnID) {
		return
	}
	d := a.drafts[m.TurnID]
	if d == nil {
		d = &draft{key: m.SessionKey, turn: m.TurnID}
		if prev := a.drafts[a.liveDraft[m.SessionKey]]; prev != nil && (prev.finishing || prev.dropped) {
			d.after = prev.turn
		}
		a.drafts[m.TurnID] = d
		a.liveDraft[m.SessionKey] = m.TurnID
	}
	if d.key != m.SessionKey {
		return
	}
	d.finishing = true
	d.finishes++
	a.timers.SendOnce(finishWait, c.Self(), &finishOverdue{turn: m.TurnID, finish: d.finishes})
}

// onFinishOverdue ends the wait of a finished turn's draft whose final outbound has not come
// within finishWait of the last FinishDraft: the draft is marked interrupted (a stand-in is
// forgotten), and an outbound that comes later is posted as a message of its own. Before, the
// key's later drafts waited for it for the daemon's lifetime, and were never shown.
func (a *Platform) onFinishOverdue(c actor.Context, m *finishOverdue) {
	d := a.drafts[m.turn]
	if d == nil || !d.finishing || d.replied || d.dropped || m.finish != d.finishes {
		return
	}
	if d.id != "" || d.queued {
		a.log.Warn("a finished turn's reply did not come; its draft is marked interrupted",
			"session", d.key, "turn", d.turn, "waited", finishWait)
	}
	a.ended.add(d.turn)
	a.interruptDraft(c, d)
}

// onDropDraft marks a cancelled turn's draft as interrupted; it is never finished.
func (a *Platform) onDropDraft(c actor.Context, m *DropDraft) {
	a.ended.add(m.TurnID)
	if d := a.drafts[m.TurnID]; d != nil {
		a.interruptDraft(c, d)
	}
}

// interruptDraft ends d with the interrupted mark: the edit is queued behind what the key's
// queue holds, and the draft is forgotten once it shows (or could not be posted at all).
func (a *Platform) interruptDraft(c actor.Context, d *draft) {
	if d.broken || (d.id == "" && !d.queued) {
		a.endDraft(c, d)
		return
	}
	d.failed, d.editFails = false, 0 // the mark gets tries of its own, though edits failed before
	d.dropped = true
	d.text += InterruptedMark
	if q := a.queues[d.key]; d.id == "" && a.held[d.key] && len(q) > 0 && q[0].draftTurn == d.turn {
		// Its post waits for a retry: the mark goes out at once, and finds the draft if a try
		// made it (the held retry's timer then finds nothing to release).
		delete(a.held, d.key)
		a.inflight[d.key] = false
		a.pump(c, d.key)
	}
	a.scheduleDraft(c, d)
}

// scheduleDraft queues a post or edit of d when its text changed, at most one per
// DraftInterval (a timer brings a throttled edit later, with the latest text).
func (a *Platform) scheduleDraft(c actor.Context, d *draft) {
	if d.queued || d.failed || d.after != "" || d.text == d.shown || d.id == "" && a.draftsHeld(d.key) {
		return
	}
	// The interrupted mark goes out at once; an edit that failed is tried again after the
	// interval, and a mark that failed maxDraftEditFailures times with the send backoff.
	if d.id != "" && (!d.dropped || d.editFails > 0) {
		interval := a.draftInterval()
		if n := d.editFails - maxDraftEditFailures + 1; d.dropped && n > 0 {
			interval = min(sendBackoffBase<<min(n-1, 16), sendBackoffMax)
		}
		if wait := interval - time.Since(d.lastEdit); wait > 0 {
			if !d.ticking {
				d.ticking = true
				a.timers.SendOnce(wait, c.Self(), &draftTick{turn: d.turn})
			}
			return
		}
	}
	d.queued = true
	a.queues[d.key] = append(a.queues[d.key], &job{draftTurn: d.turn})
	a.pump(c, d.key)
}

func (a *Platform) onDraftTick(c actor.Context, m *draftTick) {
	if d := a.drafts[m.turn]; d != nil {
		d.ticking = false
		a.scheduleDraft(c, d)
	}
}

// sendDraft runs the draft job at the head of key's queue: a post of the draft's latest text
// or, once posted, an edit. A job whose draft is gone is skipped.
func (a *Platform) sendDraft(c actor.Context, key, turn string) {
	d := a.drafts[turn]
	ed, ok := a.p.(platforms.Editor)
	if d == nil || !ok {
		c.Send(c.Self(), &draftDone{key: key, turn: turn})
		return
	}
	id, text, target, inReplyTo := d.id, d.text, d.target, slices.Clone(d.inReplyTo)
	self, root, ctx, log := c.Self(), c.ActorSystem().Root, a.d.Ctx, a.log
	go func() {
		sctx, cancel := context.WithTimeout(ctx, sendTimeout)
		defer cancel()
		done := &draftDone{key: key, turn: turn, text: text}
		done.id, done.err = postDraft(sctx, ed, target, id, inReplyTo, text, log, key, turn)
		root.Send(self, done)
	}()
}

// postDraft posts a draft (id empty) or edits it, with a panic of the platform turned into an
// undeliverable error (see sendPlatform).
func postDraft(ctx context.Context, ed platforms.Editor, target identity.Source, id string, inReplyTo []string, text string,
	log *slog.Logger, key, turn string) (newID string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %w", platformPanicked(log, "draft", v, "session", key, "turn", turn), platforms.ErrUndeliverable)
		}
	}()
	if id == "" {
		return ed.SendDraft(ctx, target, inReplyTo, turn, text)
	}
	return "", ed.EditDraft(ctx, target, id, text)
}

func (a *Platform) onDraftDone(c actor.Context, m *draftDone) {
	a.sending--
	a.inflight[m.key] = false
	a.popHead(m.key)
	defer a.answerQuiesce(c)
	defer a.pump(c, m.key)
	d := a.drafts[m.turn]
	if d == nil {
		return
	}
	d.queued = false
	if m.err != nil && d.id == "" && m.id != "" {
		// The try found the draft an earlier one made (its answer lost) but could not make it
		// show this text: the draft is made, so it is recorded (the next start deletes it if
		// nothing finishes it), and what it shows is left to its edits, as after a failed edit.
		// Before, the id was dropped with the error: a stop whose last tries failed so left the
		// draft in the chat with no record, showing part of an answer (found by TestHuntDrafts).
		a.openDraft(c, d, m.id)
		d.editFails = 0
	}
	switch {
	case m.err != nil && d.id == "" && errors.Is(m.err, platforms.ErrUndeliverable):
		d.failed = true // refused, so never made: the final reply is posted as a message of its own
		a.log.Warn("post draft; refused for good", "session", m.key, "turn", m.turn, logging.Err(m.err))
	case m.err != nil && d.id == "":
		// The post may have been made and its answer lost: it is tried again before anything
		// else of the key (the final reply may be next), with the same key, which finds the
		// draft already posted. Only such a try can find it, so the tries go on, like a reply's
		// send: at once at first, then with backoff, the key's later jobs waiting behind them.
		// Before, the post was given up after 3 tries, and a draft made by one of them was left
		// in the chat, never finished nor marked (TestDraftWhosePostsKeepFailingIsFinished).
		d.editFails++
		d.queued = true
		a.queues[m.key] = slices.Insert(a.queues[m.key], 0, &job{draftTurn: d.turn})
		again := d.editFails < maxDraftEditFailures
		if !again && a.stopping && d.stopTries < maxDraftEditFailures {
			d.stopTries++ // the daemon stops, and will not wait for a backoff: see stopDrafts
			again = true
		}
		if again {
			a.log.Debug("post draft; trying again", "session", m.key, "turn", m.turn, logging.Err(m.err))
			return
		}
		n := d.editFails - maxDraftEditFailures + 1
		backoff := min(sendBackoffBase<<min(n-1, 16), sendBackoffMax)
		if n <= sendWarnings || n%sendWarnEvery == 0 {
			a.log.Warn("post draft failed; retrying", "session", m.key, "turn", m.turn, "attempt", d.editFails,
				"backoff", backoff, logging.Err(m.err))
		}
		a.timers.SendOnce(backoff, c.Self(), &retrySendHeld{key: m.key})
		a.inflight[m.key], a.held[m.key] = true, true // hold the queue until the retry
		return
	case m.err != nil:
		a.log.Debug("edit draft", "session", m.key, "turn", m.turn, logging.Err(m.err))
		d.lastEdit = time.Now()
		limit := maxDraftEditFailures
		if d.dropped {
			limit = maxMarkTries
		}
		if d.editFails++; d.editFails >= limit || errors.Is(m.err, platforms.ErrUndeliverable) {
			// No more edits while the turn streams. The final reply still edits the draft (its
			// send is retried until it shows), unless the platform panicked on it: one posted
			// anew would leave the draft above it, showing the start of the same answer.
			d.failed = true
			d.broken = errors.Is(m.err, platforms.ErrUndeliverable)
			if d.dropped {
				a.log.Warn("mark a cancelled turn's draft interrupted; it stays without its mark until the next start deletes it",
					"session", m.key, "turn", m.turn, "tries", d.editFails, logging.Err(m.err))
			}
		}
	default:
		if d.id == "" {
			a.openDraft(c, d, m.id)
		}
		d.shown, d.lastEdit, d.editFails = m.text, time.Now(), 0
	}
	if d.dropped && (d.failed || d.text == d.shown) {
		if !d.failed {
			a.closeDraft(c, d.id) // it shows its interrupted mark; a failed one is left to removeOldDrafts
		}
		a.endDraft(c, d)
		return
	}
	a.scheduleDraft(c, d)
}

// openDraft takes id as d's draft, posted now, and records it in the store.
func (a *Platform) openDraft(c actor.Context, d *draft, id string) {
	d.id = id
	a.mark(c, &persistence.OpenDraft{Draft: persistence.Draft{Platform: a.p.Name(), ID: d.id,
		SessionKey: d.key, TurnID: d.turn, ChatType: d.target.ChatType, ChatID: d.target.ChatID,
		ThreadID: d.target.ThreadID, Run: a.d.Run, CreatedAt: a.d.now()}})
}

// stopDrafts prepares the drafts for the daemon's stop (its Quiesce): a draft post that waits
// for its retry is tried at once, and one that fails from now on gets maxDraftEditFailures
// more tries at once, before the stop's Quiesce is answered. A try whose answer was lost may
// have made the draft, only a try can find it, and a draft found is recorded, so the next
// start deletes it. Left to its backoff, the try came after the stop, or never, and a draft
// made so stayed in the chat, showing part of an answer.
func (a *Platform) stopDrafts(c actor.Context) {
	a.stopping = true
	for key, q := range a.queues {
		if !a.held[key] || len(q) == 0 || q[0].draftTurn == "" {
			continue
		}
		if d := a.drafts[q[0].draftTurn]; d == nil || d.id != "" {
			continue
		}
		delete(a.held, key) // the retry's timer finds nothing to release
		a.inflight[key] = false
		a.pump(c, key)
	}
}

// warnUnsureDrafts logs, as the actor stops, the drafts whose post failed and may have been
// made: no record of them is kept, so the next start cannot delete them.
func (a *Platform) warnUnsureDrafts() {
	for _, d := range a.drafts {
		if d.id == "" && d.editFails > 0 && !d.failed {
			a.log.Warn("stopping while a draft's post is unanswered; if a try made it, it stays in the chat",
				"session", d.key, "turn", d.turn, "tries", d.editFails)
		}
	}
}

// finishesDraft returns out with DraftID set when it is the final outbound of a turn with a
// draft; the draft is then over.
func (a *Platform) finishesDraft(c actor.Context, out *platforms.Outbound) *platforms.Outbound {
	d := a.drafts[out.TurnID]
	if out.TurnID == "" || d == nil || d.dropped || d.key != out.SessionKey {
		return out
	}
	a.endDraft(c, d)
	if d.id == "" || d.broken || out.DraftID != "" {
		return out
	}
	o := *out
	o.InReplyTo = slices.Clone(out.InReplyTo)
	o.DraftID = d.id
	return &o
}

// closeDraft forgets the record of a draft that shows what it should: its final text, or its
// interrupted mark.
func (a *Platform) closeDraft(c actor.Context, id string) {
	if id != "" {
		a.mark(c, &persistence.CloseDraft{Platform: a.p.Name(), ID: id})
	}
}

// oldDraftsFound are the session keys whose drafts of earlier runs removeOldDrafts deletes.
type oldDraftsFound struct{ keys []string }

// oldDraftsRemoved are the drafts removeOldDrafts deleted from the platform, and the keys it
// is done with.
type oldDraftsRemoved struct{ ids, keys []string }

// removeOldDrafts deletes, in a goroutine, the drafts that earlier runs of the daemon posted
// and never finished, and then closes their records. This run's drafts are never touched: they
// carry its Run. Until it has read which keys have such drafts (oldDraftsFound), and then until
// a key's are deleted, no draft is posted for the key (draftsHeld): before, a rerun's new draft
// was posted beside the one the last run left, and the chat showed two drafts in progress until
// the old one was deleted (TestNewDraftWaitsForTheOldOnesDeletion, found by TestHuntDrafts).
// Replies are not held.
func (a *Platform) removeOldDrafts(c actor.Context) {
	ed, ok := a.p.(platforms.Editor)
	if !ok || a.d.Run == "" || a.d.Store == nil {
		a.oldDraftsRead = true
		return
	}
	self, root, ctx, store, name, run := c.Self(), c.ActorSystem().Root, a.d.Ctx, a.d.Store, a.p.Name(), a.d.Run
	log := a.log
	go func() {
		ds, err := store.OpenDrafts(ctx, name, 0)
		if err != nil {
			log.Warn("read the drafts earlier runs left; they stay", logging.Err(err))
			root.Send(self, &oldDraftsFound{})
			return
		}
		var keys []string
		for _, d := range ds {
			if d.Run != run && !slices.Contains(keys, d.SessionKey) {
				keys = append(keys, d.SessionKey)
			}
		}
		root.Send(self, &oldDraftsFound{keys: keys})
		var removed []string
		for _, d := range ds {
			if d.Run == run {
				continue
			}
			target := identity.Source{Platform: name, ChatType: d.ChatType, ChatID: d.ChatID, ThreadID: d.ThreadID}
			err := deleteDraft(ctx, ed, target, d.ID, log)
			if err != nil {
				log.Warn("delete a draft an earlier run left; it stays", "session", d.SessionKey, "draft", d.ID, logging.Err(err))
				continue
			}
			removed = append(removed, d.ID)
		}
		if len(removed) > 0 {
			log.Info("deleted the drafts earlier runs left unfinished; their messages answer anew", "drafts", len(removed))
		}
		root.Send(self, &oldDraftsRemoved{ids: removed, keys: keys})
	}()
}

// draftsHeld reports whether key's drafts wait for removeOldDrafts.
func (a *Platform) draftsHeld(key string) bool { return !a.oldDraftsRead || a.oldDrafts[key] }

func (a *Platform) onOldDraftsFound(c actor.Context, m *oldDraftsFound) {
	a.oldDraftsRead = true
	for _, k := range m.keys {
		if a.oldDrafts == nil {
			a.oldDrafts = map[string]bool{}
		}
		a.oldDrafts[k] = true
	}
	for _, d := range a.drafts {
		a.scheduleDraft(c, d)
	}
}

// deleteDraft deletes a draft an earlier run left, with a panic of the platform turned into an
// error (see sendPlatform).
func deleteDraft(ctx context.Context, ed platforms.Editor, target identity.Source, id string, log *slog.Logger) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = platformPanicked(log, "delete draft", v, "draft", id)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	return ed.DeleteDraft(ctx, target, id)
}

func (a *Platform) onOldDraftsRemoved(c actor.Context, m *oldDraftsRemoved) {
	for _, id := range m.ids {
		a.closeDraft(c, id)
	}
	for _, k := range m.keys {
		delete(a.oldDrafts, k)
	}
	for _, d := range a.drafts {
		if slices.Contains(m.keys, d.key) {
			a.scheduleDraft(c, d)
		}
	}
}
