package spool

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/persistence"
)

// fuzzSeeds are batch files for the spool fuzzers: every op type, and near misses.
func fuzzSeeds(f *testing.F) {
	f.Helper()
	all, err := encode([][]persistence.Op{opSamples()[:10], opSamples()[10:]}, t0)
	if err != nil {
		f.Fatal(err)
	}
	one, err := encode(batchOf(4), t0.In(cest))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range [][]byte{
		all, one, all[:len(all)/2], one[:len(one)-1], append(bytes.Clone(one), '\n'),
		[]byte(`{"version":1,"created_at":"2025-01-02T03:04:05Z","groups":[]}`),
		[]byte(`{"version":1,"created_at":"2025-01-02T03:04:05Z","groups":null}`),
		[]byte(`{"version":1,"created_at":"2025-01-02T03:04:05Z","groups":[[]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"TouchSession","op":{}}]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"TouchSession","op":null}]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"TouchSession"}]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"Nope","op":{}}]]}`),
		[]byte(`{"version":1,"groups":[[null]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"SetMessageStatus","op":{"Seqs":null}}]]}`),
		[]byte(`{"version":1,"groups":[[{"type":"AppendMessage","op":{"Message":{"CreatedAt":"0000-01-01T00:00:00Z"}}}]]}`),
		[]byte(`{"version":2,"created_at":"2025-01-02T03:04:05Z","groups":[]}`),
		[]byte(`{"version":1,"version":1,"groups":[]} `),
		[]byte("\x00\xff"), {},
	} {
		f.Add(s)
	}
}

// FuzzDecodeOps: a batch file DecodeOps accepts holds only ops of the known types, and encoding
// what it decoded gives a file that decodes to the same batch (nothing is lost or invented by a
// replay); anything else is an error, never a panic.
func FuzzDecodeOps(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		groups, createdAt, err := DecodeOps(data)
		if err != nil {
			if groups != nil {
				t.Fatalf("DecodeOps(%q) = %v groups and error %v, want no groups", data, len(groups), err)
			}
			return
		}
		for i, g := range groups {
			for j, op := range g {
				if op == nil {
					t.Fatalf("DecodeOps(%q): group %d op %d is nil", data, i, j)
				}
			}
		}
		again, err := encode(groups, createdAt)
		if err != nil {
			t.Fatalf("DecodeOps(%q) decoded a batch that does not encode: %v", data, err)
		}
		groups2, createdAt2, err := DecodeOps(again)
		if err != nil {
			t.Fatalf("DecodeOps(encode(DecodeOps(%q))) = %v", data, err)
		}
		if diff := cmp.Diff(groups, groups2); diff != "" || !createdAt.Equal(createdAt2) {
			t.Fatalf("DecodeOps(%q) does not round-trip (-first +second):\n%s\ncreated_at %v then %v", data, diff, createdAt, createdAt2)
		}
	})
}

// FuzzSpoolNext: a batch file of any content between two good batches never stops the spool or
// loses a batch. Next yields the good batches intact and in order; the file in the middle is
// either a batch (what DecodeOps makes of it) or a CorruptError naming it, after which
// Quarantine keeps its bytes in failed/.
func FuzzSpoolNext(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		s := MustOpen(t, dir)
		first := MustAppend(t, s, batchOf(1))
		middle := batchName(2)
		MustWriteFile(t, filepath.Join(dir, middle), data)
		s.next = 3 // what Open would number after the file put in by hand
		last := MustAppend(t, s, batchOf(2))
		s = MustOpen(t, dir) // finds all three
		if s.Len() != 3 {
			t.Fatalf("Len() = %d, want 3", s.Len())
		}

		if b := MustNext(t, s); b.Name != first || !cmp.Equal(b.Groups, batchOf(1)) {
			t.Fatalf("first Next() = %s %v, want %s %v", b.Name, b.Groups, first, batchOf(1))
		}
		MustRemove(t, s, first)

		b, err := s.Next()
		var ce *CorruptError
		switch {
		case errors.As(err, &ce):
			if ce.Name != middle {
				t.Fatalf("Next() = CorruptError for %s, want %s", ce.Name, middle)
			}
			if err := s.Quarantine(middle, ce.Error()); err != nil {
				t.Fatalf("Quarantine(%s) = %v", middle, err)
			}
			kept, err := os.ReadFile(filepath.Join(dir, failedDir, middle))
			if err != nil || !bytes.Equal(kept, data) {
				t.Fatalf("quarantined batch = %q, %v, want the file's bytes %q", kept, err, data)
			}
		case err != nil:
			t.Fatalf("Next() on %q = %v, want a batch or a CorruptError", data, err)
		default:
			want, _, derr := DecodeOps(data)
			if derr != nil || b.Name != middle || !cmp.Equal(b.Groups, want) {
				t.Fatalf("Next() on %q = %s %v, want %s %v (%v)", data, b.Name, b.Groups, middle, want, derr)
			}
			MustRemove(t, s, middle)
		}

		if b := MustNext(t, s); b.Name != last || !cmp.Equal(b.Groups, batchOf(2)) {
			t.Fatalf("last Next() = %s %v, want %s %v", b.Name, b.Groups, last, batchOf(2))
		}
		MustRemove(t, s, last)
		if b := MustNext(t, s); b != nil {
			t.Fatalf("Next() after the last batch = %s, want none", b.Name)
		}
	})
}
