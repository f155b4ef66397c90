package platformtest

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/google/go-cmp/cmp"
)

func TestEditorFakeDraftsGrowAndFinish(t *testing.T) {
	f := NewEditorFake("")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	target := identity.Source{Platform: FakeName, ChatType: identity.ChatDM, ChatID: "c"}
	id, err := f.SendDraft(ctx, target, []string{"m1"}, "t1", "Hel")
	if err != nil || id != "draft-1" {
		t.Fatalf("SendDraft = %q, %v; want draft-1, nil", id, err)
	}
	if err := f.EditDraft(ctx, target, id, "Hello"); err != nil {
		t.Fatalf("EditDraft: %v", err)
	}
	if err := f.EditDraft(ctx, target, "draft-9", "x"); err == nil {
		t.Errorf("EditDraft of an unknown draft: no error")
	}
	if err := f.Send(ctx, &platforms.Outbound{SessionKey: "k", Seq: 1, Text: "Hello, world", DraftID: id}); err != nil {
		t.Fatalf("Send finishing the draft: %v", err)
	}
	ds, err := f.WaitDrafts(ctx, func(ds []Draft) bool { return len(ds) == 1 && ds[0].Final })
	if err != nil {
		t.Fatal(err)
	}
	want := []Draft{{ID: "draft-1", Target: target, InReplyTo: []string{"m1"}, Texts: []string{"Hel", "Hello", "Hello, world"}, Final: true}}
	if d := cmp.Diff(want, ds); d != "" {
		t.Errorf("drafts mismatch (-want +got):\n%s", d)
	}
	if got := ds[0].Text(); got != "Hello, world" {
		t.Errorf("Text() = %q, want the final text", got)
	}
	if n := len(f.Sent()); n != 1 {
		t.Errorf("%d outbound recorded, want 1", n)
	}
	if err := f.EditDraft(ctx, target, id, "late"); err == nil {
		t.Errorf("EditDraft of a finished draft: no error")
	}
	if err := f.Send(ctx, &platforms.Outbound{SessionKey: "k", Seq: 2, Text: "x", DraftID: "draft-7"}); err == nil {
		t.Errorf("Send with an unknown draft: no error")
	}
}
