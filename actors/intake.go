package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// Intake turns platform Inbound messages into session Deliver requests: it builds the session
// key (the one place keys are built for inbound traffic), asks the session, and maps its answer
// to a platforms.Ack. It is not an actor; platforms call Deliver from their own goroutines.
type Intake struct {
	router   SessionRouter
	store    persistence.Store // WithdrawStored's reads
	keys     identity.KeyOptions
	metrics  *metrics.Metrics
	log      *slog.Logger // a withdrawal's panic (WithdrawStored)
	draining atomic.Bool
}

// NewIntake returns an intake that routes with router, finds in store the messages a platform
// withdraws without their Source (WithdrawStored), and logs to log.
func NewIntake(router SessionRouter, store persistence.Store, keys identity.KeyOptions, m *metrics.Metrics, log *slog.Logger) *Intake {
	return &Intake{router: router, store: store, keys: keys, metrics: m, log: log}
}

// Drain stops intake: every later Deliver fails with platforms.ErrDraining.
func (in *Intake) Drain() { in.draining.Store(true) }

// Draining reports whether Drain was called.
func (in *Intake) Draining() bool { return in.draining.Load() }

// Key returns the session key of src.
func (in *Intake) Key(src identity.Source) string { return identity.Key(src, in.keys) }

// Deliver implements platforms.Deliver.
func (in *Intake) Deliver(ctx context.Context, m *platforms.Inbound) (*platforms.Ack, error) {
	if in.draining.Load() {
		return nil, platforms.ErrDraining
	}
	src := m.Source
	// A display name is the sender's to choose: from here on (rows, prompts, a subprocess's
	// environment, which cannot hold a NUL) only its neutralised form exists.
	src.UserName = identity.NeutraliseName(src.UserName)
	key := in.Key(src)
	res, err := in.router.Request(ctx, key, &Deliver{
		SessionKey: key, Source: sourceToProto(src), MessageId: m.MessageID, Text: withoutNUL(m.Text),
		ReceivedAtUnixNano: m.ReceivedAt.UnixNano(), StrictId: m.StrictID,
	})
	if errors.Is(err, ErrTimeout) {
		// The session did not answer in time: held by the manager while it backs off from
		// refused writes (a full disk), or busy. The message may yet be stored; sent again
		// with the same id, it is stored once.
		return nil, fmt.Errorf("deliver to %s: %w: %w", key, platforms.ErrUnavailable, err)
	}
	if err != nil {
		return nil, fmt.Errorf("deliver to %s: %w", key, err)
	}
	r, ok := res.(*DeliverResult)
	if !ok {
		return nil, fmt.Errorf("deliver to %s: unexpected answer %T", key, res)
	}
	ack := &platforms.Ack{SessionKey: r.SessionKey, SessionID: r.SessionId, MessageID: r.MessageId,
		Disposition: r.Disposition, QueueDepth: int(r.QueueDepth), OutboxAfter: r.OutboxAfter}
	switch r.ErrorCode {
	case "":
		if ack.Disposition != platforms.Duplicate { // a client's retry is not a message more
			in.metrics.InboundTotal.WithLabelValues(m.Source.Platform).Inc()
		}
		return ack, nil
	case "rejected":
		ack.Disposition = platforms.Rejected
		return ack, fmt.Errorf("%w: %s", platforms.ErrRejected, r.Error)
	case ErrCodeStopped:
		if in.draining.Load() {
			// Its session stopped because the daemon is stopping: a platform that reads back
			// at its next start what came meanwhile (Discord's backfill) tells no one to send it
			// again, or its sender is told so and then answered all the same.
			return ack, fmt.Errorf("%w: %w: %s", platforms.ErrDraining, platforms.ErrUnavailable, r.Error)
		}
		return ack, fmt.Errorf("%w: %s", platforms.ErrUnavailable, r.Error)
	case "unavailable":
		return ack, fmt.Errorf("%w: %s", platforms.ErrUnavailable, r.Error)
	case ErrCodeConflict:
		return ack, fmt.Errorf("%w: %s", platforms.ErrConflict, r.Error)
	case ErrCodeMessageIDReused:
		return ack, fmt.Errorf("%w: %s", platforms.ErrReused, r.Error)
	default:
		return ack, fmt.Errorf("deliver to %s: %s", key, r.Error)
	}
}

// Withdraw implements platforms.Withdraw: it asks the session of src's key to take back message
// id, delivered with src, which its sender deleted. The key is built as Deliver built it, so the
// request reaches the session that holds the message, on whichever member owns the key. It
// reports whether the message was taken back; false with a nil error means it was not waiting
// there (running or answered already, or never taken).
func (in *Intake) Withdraw(ctx context.Context, src identity.Source, id string) (bool, error) {
	src.UserName = identity.NeutraliseName(src.UserName)
	return in.withdraw(ctx, in.Key(src), src, id)
}

// WithdrawStored implements platforms.WithdrawStored: it finds the messages ids of chatID in
// the store (one read by the index of inbound ids, FindInbounds, for a purge's 100 as for one)
// and, for each that waits there unanswered, asks the session it was stored in to take it back,
// by that session's key (the key the message was delivered under, whatever the platform knows
// of its sender now), on whichever member owns the key, if that session is of thread threadID
// (posted in the chat itself: of no thread, or of the thread opened from the message, whose id
// is the message's), all at once. A message the store does not hold, or holds answered or
// archived, is not asked about: the platform falls back on the store for every deletion it
// cannot place, chatter the bot never took included. Nor is one of another thread of the chat:
// the index names the chat only, and a thread's chat is its parent channel, which its sibling
// threads share; a deletion naming thread T withdrew a message of the same id stored for a
// sibling (a review found it; the platform's ids are unique, so only a forged or mistaken event
// could name one). Each session is read once. A withdrawal that panics fails with the panic's
// value. Before, each id cost its own reads (TestBulkDeleteOfMessagesTakenBeforeARestartReadsTheStoreOnce).
func (in *Intake) WithdrawStored(ctx context.Context, platform, chatID, threadID string, ids []string) []platforms.StoredWithdrawal {
	out := make([]platforms.StoredWithdrawal, len(ids))
	for i, id := range ids {
		out[i].ID = id
	}
	if in.store == nil || len(ids) == 0 {
		return out
	}
	rows, err := in.store.FindInbounds(ctx, platform, chatID, ids)
	if err != nil {
		for i, id := range ids {
			if id != "" {
				out[i].Err = fmt.Errorf("withdraw %s: %w", id, err)
			}
		}
		return out
	}
	stored := make(map[string]*persistence.Message, len(rows))
	for i := range rows {
		stored[rows[i].MessageID] = &rows[i]
	}
	type session struct {
		s   *persistence.Session
		err error
	}
	sessions := map[string]session{}
	var wg sync.WaitGroup
	for i, id := range ids {
		m := stored[id]
		if m == nil || m.Status != persistence.StatusPending || !m.Active || m.Archived {
			continue // not taken, or answered or set aside already
		}
		ss, ok := sessions[m.SessionID]
		if !ok {
			ss.s, ss.err = in.store.Session(ctx, m.SessionID)
			sessions[m.SessionID] = ss
		}
		if ss.err != nil {
			// The message waits: the platform says it is answered.
			out[i].Source = identity.Source{Platform: m.Platform, ChatID: m.ChatID, UserID: m.UserID, UserName: m.UserName}
			out[i].Err = fmt.Errorf("withdraw %s: %w", id, ss.err)
			continue
		}
		s := ss.s
		if s.ThreadID != threadID && (threadID != "" || s.ThreadID != id) {
			continue // another thread's message
		}
		src := identity.Source{Platform: s.Platform, ChatType: s.ChatType, ChatID: s.ChatID, ThreadID: s.ThreadID,
			UserID: m.UserID, UserName: m.UserName, ScopeID: s.ScopeID, Profile: s.Profile}
		out[i].Source = src
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					// Its stack, as the platform's recover logged it when each withdrawal ran on
					// a goroutine of its own there: here, the platform sees the error alone.
					// Before, the stack was lost (TestWithdrawStoredThatPanicsLogsItsStack).
					in.log.Error(msgWithdrawPanicked, logging.KeySession, s.Key, logging.KeyMessage, id,
						"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
					out[i].Taken, out[i].Err = false, fmt.Errorf("withdraw %s: withdraw panicked: %v", id, v)
				}
			}()
			out[i].Taken, out[i].Err = in.withdraw(ctx, s.Key, src, id)
		})
	}
	wg.Wait()
	return out
}

// msgWithdrawPanicked is WithdrawStored's line for a withdrawal that panicked; docs/RUNBOOK.md
// explains it.
const msgWithdrawPanicked = "the withdrawal of a deleted message panicked; it counts as not withdrawn"

// withdraw asks the session of key to take back message id of src.
func (in *Intake) withdraw(ctx context.Context, key string, src identity.Source, id string) (bool, error) {
	res, err := in.router.Request(ctx, key, &Withdraw{Source: sourceToProto(src), MessageId: id})
	if err != nil {
		return false, fmt.Errorf("withdraw %s from %s: %w", id, key, err)
	}
	r, ok := res.(*WithdrawResult)
	if !ok {
		return false, fmt.Errorf("withdraw %s from %s: unexpected answer %T", id, key, res)
	}
	if r.Error != "" {
		return false, fmt.Errorf("withdraw %s from %s: %s", id, key, r.Error)
	}
	return r.Withdrawn, nil
}
