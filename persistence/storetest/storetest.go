// Package storetest is the conformance suite of persistence.Store. Every implementation
// (sqlite, postgres) calls Run from its own tests with a function that opens a fresh, empty
// store; the suite then checks the contract documented in package persistence through the
// Store's methods only.
//
// The suite uses fixed times (never time.Now) and is safe to run under -race and -shuffle. It
// imports persistence only.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Run runs the conformance suite as named subtests of t. open must return a fresh, empty store
// for the test it is given and close it when that test ends (Close must be idempotent: some
// subtests close the store themselves).
func Run(t *testing.T, open func(t *testing.T) persistence.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s persistence.Store)
	}{
		{"CreateSessionIdentity", testCreateSessionIdentity},
		{"IdempotentReapply", testIdempotentReapply},
		{"Counters", testCounters},
		{"DeliveryAttempts", testDeliveryAttempts},
		{"GroupAtomicity", testGroupAtomicity},
		{"FailedTransaction", testFailedTransaction},
		{"EmptyCommit", testEmptyCommit},
		{"DuplicateInbound", testDuplicateInbound},
		{"RoutingGenerations", testRoutingGenerations},
		{"ConcurrentRouting", testConcurrentRouting},
		{"RoutingRebuildNeverRollsBack", testRoutingRebuildNeverRollsBack},
		{"ConcurrentReadsAndWrites", testConcurrentReadsAndWrites},
		{"LoadSession", testLoadSession},
		{"LoadSessionUnknownKey", testLoadSessionUnknownKey},
		{"LoadSessionMissingSession", testLoadSessionMissingSession},
		{"RepliesTo", testRepliesTo},
		{"OutboxAfter", testOutboxAfter},
		{"OutboxPagesBoundedByBytes", testOutboxPagesBoundedByBytes},
		{"Transcript", testTranscript},
		{"TranscriptAfter", testTranscriptAfter},
		{"TranscriptPagesBoundedByBytes", testTranscriptPagesBoundedByBytes},
		{"PendingAfter", testPendingAfter},
		{"CountMessages", testCountMessages},
		{"History", testHistory},
		{"ListSessions", testListSessions},
		{"Recoverable", testRecoverable},
		{"RecentChats", testRecentChats},
		{"SessionsOfKey", testSessionsOfKey},
		{"IdleSessions", testIdleSessions},
		{"IdleSessionsPaging", testIdleSessionsPaging},
		{"ReopenSession", testReopenSession},
		{"ResetDueMark", testResetDueMark},
		{"SetAttempts", testSetAttempts},
		{"Requeue", testRequeue},
		{"Quarantined", testQuarantined},
		{"UncleanStops", testUncleanStops},
		{"UncleanStopsOnProbation", testUncleanStopsOnProbation},
		{"UncleanStopsCountOnlyMarkedStruck", testUncleanStopsCountOnlyMarkedStruck},
		{"Pardon", testPardon},
		{"PruneSessions", testPruneSessions},
		{"PruneSessionsLimit", testPruneSessionsLimit},
		{"PruneSteps", testPruneSteps},
		{"PruneConcurrentWithCommit", testPruneConcurrentWithCommit},
		{"PruneSweepsTheOutbox", testPruneSweepsTheOutbox},
		{"EndSessionKeepsFirstReason", testEndSession},
		{"TouchSessionMonotonic", testTouchSession},
		{"PullBack", testPullBack},
		{"MessageStatusAndTitle", testStatusAndTitle},
		{"UsageAddsOncePerTurn", testUsage},
		{"Drafts", testDrafts},
		{"Unread", testUnread},
		{"Search", testSearch},
		{"ClaimAndFence", testClaimAndFence},
		{"ClaimWaitsForFencedCommits", testClaimWaitsForFencedCommits},
		{"ConditionalClaim", testConditionalClaim},
		{"FindInbounds", testFindInbounds},
		{"NotFound", testNotFound},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

// MustCommit commits ops as one group in a batch of its own and fails the test on error.
func MustCommit(t testing.TB, s persistence.Store, ops ...persistence.Op) {
	t.Helper()
	errs := s.Commit(context.Background(), [][]persistence.Op{ops})
	if len(errs) != 1 {
		t.Fatalf("Commit(1 group) returned %d errors, want 1", len(errs))
	}
	if errs[0] != nil {
		t.Fatalf("Commit: %v", errs[0])
	}
}

// checked is a (value, error) result waiting to be checked by must.
type checked[T any] struct {
	v   T
	err error
}

func check[T any](v T, err error) checked[T] { return checked[T]{v, err} }

// must returns the value or fails the test with the error.
func (c checked[T]) must(t testing.TB, what string) T {
	t.Helper()
	if c.err != nil {
		t.Fatalf("%s: %v", what, c.err)
	}
	return c.v
}

// cmpOpts compare store rows: nil and empty slices are equal.
var cmpOpts = []cmp.Option{cmpopts.EquateEmpty()}

// diff fails the test when got and want differ.
func diff(t testing.TB, what string, got, want any) {
	t.Helper()
	if d := cmp.Diff(want, got, cmpOpts...); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
	}
}

// Fixed times: the suite never reads the clock.
var t0 = time.Unix(1_700_000_000, 123_456_789)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func newSession(id, key string) persistence.Session {
	return persistence.Session{
		ID: id, Key: key, Platform: "http", ChatType: "dm", ChatID: "chat-" + key,
		UserID: "user-" + key, UserName: "Ann", Profile: "main",
		StartedAt: at(0), LastActivityAt: at(0), Epoch: 1, QueueMode: "collect",
	}
}

func userMsg(sid string, seq int64, msgID, text string) persistence.Message {
	return persistence.Message{
		SessionID: sid, Seq: seq, Role: persistence.RoleUser, Content: text,
		Platform: "http", ChatID: "chat", MessageID: msgID, UserID: "sender-" + msgID, UserName: "Sender " + msgID,
		Status: persistence.StatusPending, Active: true, CreatedAt: at(int(seq)),
	}
}

func replyMsg(sid string, seq int64, text string) persistence.Message {
	return persistence.Message{
		SessionID: sid, Seq: seq, Role: persistence.RoleAssistant, Content: text,
		Status: persistence.StatusDone, TurnID: "turn-1", Active: true, CreatedAt: at(int(seq)),
	}
}

func outboxEntry(key string, seq int64, sid string, inReplyTo ...string) persistence.OutboxEntry {
	return persistence.OutboxEntry{
		SessionKey: key, Seq: seq, SessionID: sid, Kind: "reply", Text: "reply text",
		TurnID: "turn-1", InReplyTo: inReplyTo, Platform: "http", ChatType: "dm",
		ChatID: "chat-" + key, UserID: "user-" + key, State: persistence.DeliveryPending,
		CreatedAt: at(int(seq)),
	}
}

func route(key, sid string, gen int64) persistence.Route {
	return persistence.Route{Key: key, SessionID: sid, Generation: gen, UpdatedAt: at(int(gen))}
}

// start creates a session and routes its key to it.
func start(t testing.TB, s persistence.Store, id, key string, gen int64) persistence.Session {
	t.Helper()
	ss := newSession(id, key)
	r := route(key, id, gen)
	MustCommit(t, s, &persistence.CreateSession{Session: ss}, &persistence.PutRoute{Route: r})
	return ss
}

func outboxSeqs(es []persistence.OutboxEntry) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

// unknownOp is an Op type no store knows.
type unknownOp struct{ persistence.Op }
