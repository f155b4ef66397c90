package supervisor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// sessionsAPI answers the HTTP API's session queries from the store and the live actors.
type sessionsAPI struct{ d *Daemon }

var _ httpplatform.Sessions = (*sessionsAPI)(nil)

// List returns one page of known sessions, with Next only while more follow: a page that ends
// at the last key that matches says so, so that a client paging until Next is empty does not
// ask for an empty page. The state filter asks the manager which actors are in memory.
func (a *sessionsAPI) List(ctx context.Context, f httpplatform.ListRequest) (*httpplatform.SessionList, error) {
	active, err := a.activeKeys(ctx)
	if err != nil {
		return nil, err
	}
	if f.Limit < 1 {
		f.Limit = httpplatform.DefaultListLimit
	}
	if f.State == httpplatform.StateActive {
		return a.listActive(ctx, f, active)
	}
	out := &httpplatform.SessionList{Sessions: []*httpplatform.SessionInfo{}}
	after := f.After
	for {
		// One row more than the page holds tells, without a filter, whether more follow.
		rows, err := a.d.store.ListSessions(ctx, persistence.ListFilter{Platform: f.Platform, AfterKey: after, Limit: f.Limit + 1})
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		for i := range rows {
			r := &rows[i]
			live := active[r.Session.Key]
			if f.State == httpplatform.StateActive && !live || f.State == httpplatform.StatePassivated && live {
				continue
			}
			if len(out.Sessions) == f.Limit {
				// A key that matches follows the full page: the page's last key is where the
				// next one starts.
				out.Next = out.Sessions[len(out.Sessions)-1].SessionKey
				return out, nil
			}
			info := sessionInfo(r.Session.Key, &r.Session, r.Messages, r.Pending)
			if live {
				if info.Live, err = a.live(ctx, r.Session.Key); err != nil {
					return nil, err
				}
			}
			out.Sessions = append(out.Sessions, info)
		}
		if len(rows) <= f.Limit {
			return out, nil
		}
		after = rows[len(rows)-1].Session.Key
	}
}

// listActive is List of the sessions in memory: it reads the keys the manager holds, in key
// order, and the store for those alone. The sessions in memory are bounded
// (sessions.max_in_memory), the stored ones are not: before, ?state=active read every stored
// session to keep the few in memory, 1.7 s for one in 100,000 (3.1 s with ?limit=10), so a
// dashboard polling it kept a core busy on a large database.
func (a *sessionsAPI) listActive(ctx context.Context, f httpplatform.ListRequest, active map[string]bool) (*httpplatform.SessionList, error) {
	keys := make([]string, 0, len(active))
	for k := range active {
		if k > f.After { // byte order, as the stores' key order (PostgreSQL's COLLATE "C")
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := &httpplatform.SessionList{Sessions: []*httpplatform.SessionInfo{}}
	for _, key := range keys {
		info, err := a.stored(ctx, key)
		if errors.Is(err, persistence.ErrNotFound) {
			continue // no session stored yet, or its row is gone: ListSessions leaves it out too
		}
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		if f.Platform != "" && info.Platform != f.Platform {
			continue
		}
		if len(out.Sessions) == f.Limit {
			out.Next = out.Sessions[len(out.Sessions)-1].SessionKey
			return out, nil
		}
		if info.Live, err = a.live(ctx, key); err != nil {
			return nil, err
		}
		out.Sessions = append(out.Sessions, info)
	}
	return out, nil
}

// stored returns a key's current session as the store holds it, without live state;
// persistence.ErrNotFound when the key has none.
func (a *sessionsAPI) stored(ctx context.Context, key string) (*httpplatform.SessionInfo, error) {
	route, err := a.d.store.Route(ctx, key)
	if err != nil {
		return nil, err
	}
	s, err := a.d.store.Session(ctx, route.SessionID)
	if err != nil {
		return nil, err
	}
	// Counted by the store: a dashboard polling a session of months must not read its history.
	messages, pending, err := a.d.store.CountMessages(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	return sessionInfo(key, s, messages, pending), nil
}

func (a *sessionsAPI) activeKeys(ctx context.Context) (map[string]bool, error) {
	res, err := actors.Await(ctx, a.d.system.Root.RequestFuture(a.d.manager, &actors.ListActive{}, requestTimeout(ctx)))
	if err != nil {
		return nil, fmt.Errorf("list active sessions: %w", err)
	}
	keys := map[string]bool{}
	for _, k := range res.(*actors.ActiveList).Keys {
		keys[k] = true
	}
	return keys, nil
}

// Get returns a key's current session with the live state of its actor when one is in memory
// (it never activates one: live).
func (a *sessionsAPI) Get(ctx context.Context, key string) (*httpplatform.SessionInfo, error) {
	if _, err := identity.ParseKey(key); err != nil {
		return nil, fmt.Errorf("get session: %w", persistence.ErrNotFound)
	}
	info, err := a.stored(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get session: %w", err)
	}
	if info.Live, err = a.live(ctx, key); err != nil {
		return nil, err
	}
	return info, nil
}

// live returns the live state of key's session actor, or nil when it is passivated; it never
// activates a session. In cluster mode it asks the manager of the member that owns the key,
// whose address the answer names: a manager answers for its own sessions only.
func (a *sessionsAPI) live(ctx context.Context, key string) (*httpplatform.LiveState, error) {
	manager := a.d.managerOf(key)
	res, err := actors.Await(ctx, a.d.system.Root.RequestFuture(manager, &actors.Peek{Key: key}, requestTimeout(ctx)))
	if err != nil {
		return nil, fmt.Errorf("session state of %s: %w", key, err)
	}
	st := res.(*actors.SessionState)
	if !st.Active {
		return nil, nil
	}
	live := &httpplatform.LiveState{Active: true, QueueDepth: int(st.QueueDepth), QueueMode: st.QueueMode,
		RunningTurnID: st.RunningTurnId, Restarts: int(st.Restarts), Node: st.Node, Probation: st.Probation,
		MailboxDepth: int(a.d.metrics.Actor("session").Box.Depth())}
	if st.RunningSinceUnixNano != 0 {
		live.RunningSince = time.Unix(0, st.RunningSinceUnixNano).UTC()
	}
	if st.ActivatedAtUnixNano != 0 {
		live.ActivatedAt = time.Unix(0, st.ActivatedAtUnixNano).UTC()
	}
	if a.d.cluster != nil {
		// This member's own manager was spawned before the cluster gave it an address.
		live.MemberAddress = manager.Address
		if manager == a.d.manager {
			live.MemberAddress = a.d.system.Address()
		}
	}
	return live, nil
}

// Reset ends the key's current session and returns the new one.
func (a *sessionsAPI) Reset(ctx context.Context, key string) (*httpplatform.SessionInfo, error) {
	if _, err := a.d.store.Route(ctx, key); err != nil {
		return nil, fmt.Errorf("reset session: %w", err)
	}
	res, err := a.d.router.Request(ctx, key, &actors.ResetSession{Reason: persistence.EndResetCommand})
	if err != nil {
		return nil, fmt.Errorf("reset session: %w", notTaken(err))
	}
	r, ok := res.(*actors.ResetResult)
	if !ok {
		return nil, fmt.Errorf("reset session: the session answered %T", res)
	}
	switch {
	case r.ErrorCode == actors.ErrCodeUnavailable, r.ErrorCode == actors.ErrCodeStopped:
		// The store refused it, or the session stopped before its write was answered (the
		// answer says whether it may have taken effect).
		return nil, &httpplatform.RefusedError{Code: httpplatform.CodeUnavailable, Message: r.Error}
	case r.Error != "":
		return nil, fmt.Errorf("reset session: %s", r.Error)
	}
	info, err := a.Get(ctx, key)
	switch {
	case err != nil:
	case r.SessionId != "" && info.SessionID != r.SessionId:
		// The database does not show the reset yet: its writes wait in the spool. It is done
		// all the same (the spool replays them in order), so the answer is the session it
		// began, not the one read back, which it ended: before, that one was answered as the
		// key's open session, and agentgate sessions reset reported it so.
		info = a.begunByReset(ctx, key, info, r)
	case r.SessionId == "" && r.EndedSessionId == info.SessionID && info.EndedAt == nil && r.EndedAtUnixNano != 0:
		// There was nothing to end: the session had ended already, but its end waits in the
		// spool, and the database shows it open. It is answered ended, as the database will
		// show it: before, it was answered as the key's open session, and agentgate sessions
		// reset reported a reset made.
		ended := time.Unix(0, r.EndedAtUnixNano).UTC()
		info.EndedAt, info.EndReason = &ended, r.EndReason
	}
	if info != nil {
		info.Kept = r.Kept
	}
	return info, err
}

// begunByReset is the answer to a reset that the database does not show yet: the session r
// began, of the chat that old (read back from the database) names, with old's live state,
// nothing in it yet. Its start is the one the session stored, which r says. Before, it was the
// session actor's last activity when the answer was made, which a message that came meanwhile
// had moved on, or now once another reset had ended the session
// (TestResetWhileSpoolingAnswersItsStartAsStored). A member that does not say it (an older one,
// during a rolling upgrade) is answered so still.
func (a *sessionsAPI) begunByReset(ctx context.Context, key string, old *httpplatform.SessionInfo, r *actors.ResetResult) *httpplatform.SessionInfo {
	started := time.Unix(0, r.StartedAtUnixNano).UTC()
	if r.StartedAtUnixNano == 0 {
		started = time.Now().UTC()
		res, err := actors.Await(ctx, a.d.system.Root.RequestFuture(a.d.managerOf(key), &actors.Peek{Key: key}, requestTimeout(ctx)))
		if st, ok := res.(*actors.SessionState); err == nil && ok && st.SessionId == r.SessionId && st.LastActivityUnixNano != 0 {
			started = time.Unix(0, st.LastActivityUnixNano).UTC()
		}
	}
	return &httpplatform.SessionInfo{SessionKey: key, SessionID: r.SessionId, PrevSessionID: r.PreviousSessionId,
		Platform: old.Platform, ChatType: old.ChatType, ChatID: old.ChatID, ThreadID: old.ThreadID, UserID: old.UserID,
		UserName: old.UserName, Profile: old.Profile, StartedAt: started, LastActivityAt: started, Live: old.Live}
}

// Requeue has the key's session run its quarantined message messageID again. The session does
// the work: it owns its queue and its order, and in a cluster the request reaches it on the
// member that owns the key, as a reset does.
func (a *sessionsAPI) Requeue(ctx context.Context, key, messageID string) (*httpplatform.MessageResponse, error) {
	if _, err := identity.ParseKey(key); err != nil {
		return nil, fmt.Errorf("requeue: %w", persistence.ErrNotFound)
	}
	// An unknown key is not activated for nothing.
	if _, err := a.d.store.Route(ctx, key); errors.Is(err, persistence.ErrNotFound) {
		return nil, &httpplatform.RefusedError{Code: httpplatform.CodeNoSession, Message: "no such session"}
	} else if err != nil {
		return nil, fmt.Errorf("requeue: %w", err)
	}
	res, err := a.d.router.Request(ctx, key, &actors.RequeueMessage{MessageId: messageID})
	if err != nil {
		return nil, fmt.Errorf("requeue: %w", notTaken(err))
	}
	r, ok := res.(*actors.RequeueResult)
	if !ok {
		return nil, fmt.Errorf("requeue: the session answered %T", res)
	}
	switch r.ErrorCode {
	case "":
		return &httpplatform.MessageResponse{MessageID: messageID, SessionKey: key, SessionID: r.SessionId,
			Disposition: r.Disposition, QueueDepth: int(r.QueueDepth), OutboxAfter: r.OutboxAfter}, nil
	case actors.ErrCodeNotFound:
		if r.SessionId == "" && a.routesToNoSession(ctx, key) {
			// The key's session ended and was pruned: it has none, as its GET answers. The
			// session answers not_found (so that a member of an earlier version, which knows
			// no other code here, passes it on as a 404 during a rolling upgrade); before, it
			// answered no_session for a while, which such a member failed as a 500.
			return nil, &httpplatform.RefusedError{Code: httpplatform.CodeNoSession, Message: "no such session"}
		}
		return nil, &httpplatform.RefusedError{Code: r.ErrorCode, Status: r.Status, Message: r.Error}
	case actors.ErrCodeNotQuarantined, actors.ErrCodeSessionEnded, httpplatform.CodeUnavailable:
		return nil, &httpplatform.RefusedError{Code: r.ErrorCode, Status: r.Status, Message: r.Error}
	case actors.ErrCodeStopped:
		// Its write may have committed: the message may be queued already.
		return nil, &httpplatform.RefusedError{Code: httpplatform.CodeUnavailable, Message: r.Error}
	}
	return nil, fmt.Errorf("requeue: %s: %s", r.ErrorCode, r.Error)
}

// routesToNoSession reports whether the store shows key's route naming a session it does not
// hold (one pruned after it ended): GET /v1/sessions/{key} answers such a key no_session. A
// store that cannot be read says no.
func (a *sessionsAPI) routesToNoSession(ctx context.Context, key string) bool {
	route, err := a.d.store.Route(ctx, key)
	if err != nil {
		return false
	}
	_, err = a.d.store.Session(ctx, route.SessionID)
	return errors.Is(err, persistence.ErrNotFound)
}

// Transcript returns one page of an incarnation's messages (of the current one when
// r.SessionID is empty). An earlier incarnation must belong to the same key.
func (a *sessionsAPI) Transcript(ctx context.Context, key string, r httpplatform.TranscriptRequest) (*httpplatform.Transcript, error) {
	sessionID := r.SessionID
	if sessionID == "" {
		route, err := a.d.store.Route(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("transcript: %w", err)
		}
		sessionID = route.SessionID
	}
	s, err := a.d.store.Session(ctx, sessionID)
	if err != nil {
		return nil, fmt.Errorf("transcript: %w", err)
	}
	if s.Key != key {
		return nil, fmt.Errorf("transcript: session %s of another key: %w", sessionID, persistence.ErrNotFound)
	}
	msgs, err := a.d.store.TranscriptAfter(ctx, sessionID, r.After, r.Limit)
	if err != nil {
		return nil, fmt.Errorf("transcript: %w", err)
	}
	t := &httpplatform.Transcript{SessionKey: key, SessionID: sessionID, Messages: make([]httpplatform.TranscriptMessage, 0, len(msgs))}
	for _, m := range msgs {
		t.Messages = append(t.Messages, httpplatform.TranscriptMessage{Seq: m.Seq, Role: m.Role, Text: m.Content,
			MessageID: m.MessageID, TurnID: m.TurnID, Status: m.Status, CreatedAt: m.CreatedAt, Archived: m.Archived})
	}
	return t, nil
}

// OutboxAfter returns durable outbox entries for SSE resume.
func (a *sessionsAPI) OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]*platforms.Outbound, error) {
	es, err := a.d.store.OutboxAfter(ctx, key, after, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return outbounds(es), nil
}

// LastOutboxSeq returns the seq of the key's last outbox entry, the id of its last event, or
// math.MaxInt64 while writes wait in the spool: the database does not hold the entries sent
// meanwhile, and a stream resumed after one of them, clamped to the database's last, would
// send them again once the spool drains (found by review).
func (a *sessionsAPI) LastOutboxSeq(ctx context.Context, key string) (int64, error) {
	if a.d.deps.Spooling.Load() {
		return math.MaxInt64, nil
	}
	seq, err := a.d.store.LastOutboxSeq(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("outbox: %w", err)
	}
	return seq, nil
}

// RepliesTo returns the durable replies to one message that come after the key's outbox seq
// after.
func (a *sessionsAPI) RepliesTo(ctx context.Context, key, messageID string, after int64) ([]*platforms.Outbound, error) {
	es, err := a.d.store.RepliesTo(ctx, key, messageID, after)
	if err != nil {
		return nil, fmt.Errorf("replies: %w", err)
	}
	return outbounds(es), nil
}

// Quarantined lists the quarantined messages of every session, newest first.
func (a *sessionsAPI) Quarantined(ctx context.Context, limit int) ([]httpplatform.QuarantinedMessage, error) {
	lister, ok := a.d.store.(persistence.QuarantineLister)
	if !ok {
		return nil, fmt.Errorf("quarantined: the %T store cannot list them", a.d.store)
	}
	ms, err := lister.Quarantined(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("quarantined: %w", err)
	}
	out := make([]httpplatform.QuarantinedMessage, len(ms))
	for i, m := range ms {
		out[i] = httpplatform.QuarantinedMessage{SessionKey: m.SessionKey, SessionID: m.SessionID, SessionEnded: m.SessionEnded,
			MessageID: m.MessageID, Seq: m.Seq, UserID: m.UserID, UserName: m.UserName, Text: m.Content, CreatedAt: m.CreatedAt}
	}
	return out, nil
}

func outbounds(es []persistence.OutboxEntry) []*platforms.Outbound {
	out := make([]*platforms.Outbound, len(es))
	for i := range es {
		out[i] = actors.OutboundFromEntry(&es[i])
	}
	return out
}

func sessionInfo(key string, s *persistence.Session, messages, pending int) *httpplatform.SessionInfo {
	info := &httpplatform.SessionInfo{SessionKey: key, SessionID: s.ID, PrevSessionID: s.PrevSessionID,
		Platform: s.Platform, ChatType: s.ChatType, ChatID: s.ChatID, ThreadID: s.ThreadID, UserID: s.UserID,
		UserName: s.UserName, Profile: s.Profile, StartedAt: s.StartedAt, LastActivityAt: s.LastActivityAt,
		EndReason: s.EndReason, Title: s.Title, Messages: messages, Pending: pending,
		InputTokens: s.InputTokens, OutputTokens: s.OutputTokens}
	if !s.EndedAt.IsZero() {
		t := s.EndedAt
		info.EndedAt = &t
	}
	return info
}

func requestTimeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return actors.DefaultRequestTimeout
}

// notTaken marks err with httpplatform.ErrNotTaken when the request it answers reached no
// session: a dead letter of the local router (the session manager, stopping, answers what it
// is sent so; the cluster router's dead letters are retried, and what it returns after them
// may follow an attempt that was taken).
func notTaken(err error) error {
	if errors.Is(err, actor.ErrDeadLetter) {
		return fmt.Errorf("%w: %w", httpplatform.ErrNotTaken, err)
	}
	return err
}
