package platformtest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

// Draft is one draft an EditorFake holds.
type Draft struct {
	ID        string
	Target    identity.Source
	InReplyTo []string
	// Texts are what the draft showed, in order: the posted text, each edit and, once an
	// Outbound finished the draft, that Outbound's text.
	Texts []string
	// Final is set once an Outbound with this draft's DraftID was sent.
	Final bool
	// Deleted is set once DeleteDraft removed it.
	Deleted bool
}

// Text is what the draft shows now.
func (d *Draft) Text() string {
	if len(d.Texts) == 0 {
		return ""
	}
	return d.Texts[len(d.Texts)-1]
}

// EditorFake is a Fake that can edit what it sent (platforms.Editor), as Discord can: drafts are
// posted with SendDraft and edited with EditDraft, and an Outbound whose DraftID names a draft
// finishes that draft (it is also recorded as sent, like any Outbound).
type EditorFake struct {
	*Fake
	drafts  []*Draft          // guarded by Fake.mu
	deleted []string          // ids DeleteDraft was called with, in order; guarded by Fake.mu
	keys    map[string]string // the key of each draft SendDraft posted → its id; guarded by Fake.mu
}

var _ platforms.Editor = (*EditorFake)(nil)

// NewEditorFake returns an EditorFake that reports name from Name (FakeName when empty).
func NewEditorFake(name string) *EditorFake {
	return &EditorFake{Fake: NewFake(name)}
}

// SendDraft records a new draft and returns its id ("draft-1", "draft-2", …); a draft with key
// already recorded is returned, showing text from now on.
func (f *EditorFake) SendDraft(ctx context.Context, target identity.Source, inReplyTo []string, key, text string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("send draft: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return "", f.sendErr
	}
	if id, ok := f.keys[key]; ok && key != "" {
		if d := f.draftLocked(id); d != nil && !d.Final && d.Text() != text {
			d.Texts = append(d.Texts, text)
			f.notifyLocked()
		}
		return id, nil
	}
	d := &Draft{ID: fmt.Sprintf("draft-%d", len(f.drafts)+1), Target: target, InReplyTo: slices.Clone(inReplyTo), Texts: []string{text}}
	if key != "" {
		if f.keys == nil {
			f.keys = map[string]string{}
		}
		f.keys[key] = d.ID
	}
	f.drafts = append(f.drafts, d)
	f.notifyLocked()
	return d.ID, nil
}

// EditDraft records a new text of draft id; an unknown or finished draft is an error.
func (f *EditorFake) EditDraft(ctx context.Context, _ identity.Source, id, text string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("edit draft: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.draftLocked(id)
	switch {
	case d == nil:
		return fmt.Errorf("edit draft %s: unknown draft", id)
	case d.Final:
		return fmt.Errorf("edit draft %s: already finished", id)
	}
	d.Texts = append(d.Texts, text)
	f.notifyLocked()
	return nil
}

// DeleteDraft records that draft id was deleted. An id it never posted is not an error (a
// draft of an earlier run, or one a moderator deleted), as on Discord.
func (f *EditorFake) DeleteDraft(ctx context.Context, _ identity.Source, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete draft: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return f.sendErr
	}
	if d := f.draftLocked(id); d != nil {
		d.Deleted = true
	}
	f.deleted = append(f.deleted, id)
	f.notifyLocked()
	return nil
}

// DeletedDrafts returns the ids DeleteDraft was called with, in order.
func (f *EditorFake) DeletedDrafts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// Send records out (see Fake.Send); when out.DraftID names a draft, out's text finishes it. An
// unknown or finished draft is an error and nothing is recorded.
func (f *EditorFake) Send(ctx context.Context, out *platforms.Outbound) error {
	if out != nil && out.DraftID != "" {
		f.mu.Lock()
		d := f.draftLocked(out.DraftID)
		f.mu.Unlock()
		if d == nil {
			return fmt.Errorf("send: unknown draft %s", out.DraftID)
		}
	}
	if err := f.Fake.Send(ctx, out); err != nil {
		return err
	}
	if out.DraftID == "" {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.draftLocked(out.DraftID)
	if d.Final {
		return errors.New("send: draft " + out.DraftID + " already finished")
	}
	d.Texts = append(d.Texts, out.Text)
	d.Final = true
	f.notifyLocked()
	return nil
}

func (f *EditorFake) draftLocked(id string) *Draft {
	for _, d := range f.drafts {
		if d.ID == id {
			return d
		}
	}
	return nil
}

// Drafts returns copies of the drafts so far, oldest first.
func (f *EditorFake) Drafts() []Draft {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draftsLocked()
}

func (f *EditorFake) draftsLocked() []Draft {
	out := make([]Draft, len(f.drafts))
	for i, d := range f.drafts {
		out[i] = *d
		out[i].InReplyTo = slices.Clone(d.InReplyTo)
		out[i].Texts = slices.Clone(d.Texts)
	}
	return out
}

// WaitDrafts blocks until cond holds for the drafts (and returns them), or returns the drafts
// with ctx's error.
func (f *EditorFake) WaitDrafts(ctx context.Context, cond func([]Draft) bool) ([]Draft, error) {
	for {
		f.mu.Lock()
		ds, ch := f.draftsLocked(), f.changed
		f.mu.Unlock()
		if cond(ds) {
			return ds, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ds, fmt.Errorf("wait for drafts: %w", ctx.Err())
		}
	}
}
