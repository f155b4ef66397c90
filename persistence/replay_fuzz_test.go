package persistence_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// FuzzSpoolReplay puts a batch file of any content at the head of a spool, before a good
// batch, and starts the persistence actor on it over a real, healthy SQLite store: the actor
// replays the spool when it starts. Whatever the file holds, the replay must not stop there
// (the spool drains: the file is applied or quarantined with its bytes kept, never left to
// block every later write) and the good batch behind it must reach the store. The store is
// shared by every input, so a batch that leaves it unable to take a write fails later ones.
func FuzzSpoolReplay(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"created_at":"2025-01-02T03:04:05Z","groups":[]}`,
		`{"version":1,"created_at":"2025-01-02T03:04:05Z","groups":[[]]}`,
		`{"version":1,"groups":[[{"type":"TouchSession","op":{}}]]}`,
		`{"version":1,"groups":[[{"type":"CreateSession","op":{}}],[{"type":"CreateSession","op":{}}]]}`,
		`{"version":1,"groups":[[{"type":"AppendMessage","op":{"Message":{"SessionID":"nope","Seq":-1}}}]]}`,
		`{"version":1,"groups":[[{"type":"SetMessageStatus","op":{"SessionID":"s","Seqs":null}}]]}`,
		`{"version":1,"groups":[[{"type":"ArchiveMessages","op":{"SessionID":"s","Seqs":[]}}]]}`,
		`{"version":1,"groups":[[{"type":"PutRoute","op":{"Route":{"Key":"","Generation":-9223372036854775808}}}]]}`,
		`{"version":1,"groups":[[{"type":"AddOutbox","op":{"Entry":{"InReplyTo":null,"Seq":-1}}}]]}`,
		`{"version":1,"groups":[[{"type":"MarkDelivery","op":{"SessionKey":"k","Seq":1,"State":"x"}}]]}`,
		`{"version":1,"groups":[[{"type":"AddUsage","op":{"InputTokens":9223372036854775807}}],[{"type":"AddUsage","op":{"InputTokens":9223372036854775807}}]]}`,
		`{"version":1,"groups":[[{"type":"OpenDraft","op":{}}],[{"type":"CloseDraft","op":{}}]]}`,
		`{"version":1,"groups":[[{"type":"MarkUnread","op":{}}],[{"type":"ClearUnread","op":{"Platform":"discord"}}]]}`,
		`{"version":1,"groups":[[{"type":"Fence","op":{"Key":"k","Epoch":-1}}]]}`,
		`{"version":1,"groups":[[{"type":"EndSession","op":{"At":"0001-01-01T00:00:00Z"}}]]}`,
		`{"version":1,"groups":[[{"type":"SetAttempts","op":{"Seq":1,"Attempts":-1}}],[{"type":"MarkProbation","op":{}}]]}`,
		`{"version":1,"groups":[[{"type":"TouchSession"`,
		"\x00",
	} {
		f.Add([]byte(s))
	}
	// A whole turn's writes, spooled as the actor would: mutations of its values meet the store's
	// checks (ids that do not exist, seqs out of order, states it does not know).
	life, err := spool.EncodeOps([][]persistence.Op{
		{session("s", "k", t0), &persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "s", Generation: 1, UpdatedAt: t0}}},
		{userMessage("s", 1, "m1"), &persistence.TouchSession{SessionID: "s", At: t0}},
		{&persistence.SetMessageStatus{SessionID: "s", Seqs: []int64{1}, Status: persistence.StatusDone, TurnID: "t1"},
			&persistence.AddUsage{SessionID: "s", TurnID: "t1", InputTokens: 3, OutputTokens: 4},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: 1, SessionID: "s", Kind: "reply",
				Text: "hi", TurnID: "t1", InReplyTo: []string{"m1"}, Platform: "http", ChatType: "dm", ChatID: "c",
				State: persistence.DeliveryPending, CreatedAt: t0}},
			&persistence.MarkDelivery{SessionKey: "k", Seq: 1, State: persistence.DeliveryDelivered, At: t0}},
		{&persistence.IncrementAttempts{SessionID: "s", Seqs: []int64{1}}, &persistence.SetAttempts{SessionID: "s", Seq: 1, Attempts: 2},
			&persistence.MarkProbation{SessionID: "s", Seq: 1, Run: "r"}, &persistence.ArchiveMessages{SessionID: "s", Seqs: []int64{1}}},
		{&persistence.SetTitle{SessionID: "s", Title: "t"}, &persistence.SetQueueMode{SessionID: "s", Mode: "collect"},
			&persistence.OpenDraft{Draft: persistence.Draft{Platform: "discord", ID: "d", SessionKey: "k", TurnID: "t1", CreatedAt: t0}},
			&persistence.CloseDraft{Platform: "discord", ID: "d"}, &persistence.Fence{Key: "k", Epoch: 1},
			&persistence.MarkUnread{Unread: persistence.Unread{Platform: "discord", ChatID: "c", After: "9", At: t0}},
			&persistence.ClearUnread{Platform: "discord", ChatID: "c"}},
		{&persistence.EndSession{SessionID: "s", Reason: persistence.EndNewCommand, At: t0}, &persistence.ReopenSession{SessionID: "s"}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(life)
	dir := f.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = st.Close() })
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		n++
		good := fmt.Sprintf("good-%d", n)
		sdir := filepath.Join(t.TempDir(), "spool")
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			t.Fatal(err)
		}
		head := "00000000000000000001.json"
		if err := os.WriteFile(filepath.Join(sdir, head), data, 0o600); err != nil {
			t.Fatal(err)
		}
		sp, err := spool.Open(sdir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Append([][]persistence.Op{{session(good, "key-"+good, t0)}}); err != nil {
			t.Fatal(err)
		}

		logs := &testutil.Buffer{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
		defer system.Shutdown()
		pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), st, persistence.ActorOptions{
			MaxBatch: 64, Spool: sp, ReplayEvery: time.Hour, Log: log})))
		defer func() { _ = system.Root.StopFuture(pid).Wait() }()
		// The actor replays when it starts, before it takes the Flush.
		if _, err := system.Root.RequestFuture(pid, &persistence.Flush{}, 10*time.Second).Result(); err != nil {
			t.Fatalf("Flush after a replay of %q: %v; logs:\n%s", data, err, logs)
		}

		if left, err := spool.Waiting(sdir); err != nil || left != 0 {
			t.Fatalf("after a replay of %q, %d batches wait in the spool (%v), want none; logs:\n%s", data, left, err, logs)
		}
		if kept, err := os.ReadFile(filepath.Join(sdir, "failed", head)); err == nil && !bytes.Equal(kept, data) {
			t.Fatalf("quarantined %q as %q", data, kept)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if _, err := st.Session(context.Background(), good); err != nil {
			t.Fatalf("the batch after %q did not reach the store: %v; logs:\n%s", data, err, logs)
		}
	})
}
