package exec

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
)

// FuzzCommandOutput runs a real command that prints hostile output (any bytes on stdout and
// stderr, repeated up to past MaxReply, and any exit status) and checks what Run makes of it.
// On success the reply is exactly stdout as valid UTF-8 without trailing white space, or, past
// MaxReply, a valid UTF-8 prefix of it marked with TruncatedSuffix. On failure the *ExitError has
// the command's status and a valid UTF-8 tail of its stderr of bounded size.
//
// Run it with make fuzz FUZZ=FuzzCommandOutput PKG=./agents/exec.
func FuzzCommandOutput(f *testing.F) {
	for _, s := range []struct {
		out    string
		repeat uint16
		err    string
		code   uint8
	}{
		{"hello\n", 0, "", 0},
		{"  lead and trail \t\r\n\n", 0, "", 0},
		{"\x00nul\x00", 0, "", 0},
		{"caf\xc3", 0, "", 0},
		{"\xff\xfe\xfd latin-1 \xe9", 0, "", 0},
		{"{\"partial\": \"json", 0, "", 0},
		{"\u2028\u2029\x1b[31mred\x1b[0m", 0, "", 0},
		{"😀", 1 << 15, "", 0},   // 4-byte runes across the cut
		{"ab😀", 1 << 15, "", 0}, // the cut inside a rune
		{"x", 1 << 15, "", 0},   // exactly MaxReply
		{"x\n", 1 << 15, "", 0}, // past MaxReply
		{" ", 1 << 15, "", 0},
		{"", 0, "", 0},
		{"out", 0, "boom\n", 1},
		{"", 0, "\xff\xfe stderr \x00", 2},
		{"", 0, strings.Repeat("é", 3000), 255},
	} {
		f.Add([]byte(s.out), s.repeat, []byte(s.err), s.code)
	}
	dir := f.TempDir()
	outPath, errPath := filepath.Join(dir, "out"), filepath.Join(dir, "err")
	script := `cat "$1"; cat "$2" >&2; exit "$3"`
	f.Fuzz(func(t *testing.T, out []byte, repeat uint16, stderr []byte, code uint8) {
		// repeat*32 copies, up to 3 MiB of stdout: enough to cross MaxReply with a short pattern.
		if repeat > 0 && len(out) > 0 {
			out = bytes.Repeat(out, max(1, min(int(repeat)*32, 3*MaxReply/len(out))))
		}
		if err := os.WriteFile(outPath, out, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(errPath, stderr, 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := New(Config{Command: []string{"/bin/sh", "-c", script, "sh", outPath, errPath, strconv.Itoa(int(code))},
			Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		resp, err := a.Run(ctx, &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}})

		if code != 0 {
			var ee *ExitError
			if !errors.As(err, &ee) || ee.Code != int(code) {
				t.Fatalf("Run with exit %d = %v, want an *ExitError with code %d", code, err, code)
			}
			if !utf8.ValidString(ee.Stderr) || len(ee.Stderr) > 3*MaxStderr || !utf8.ValidString(err.Error()) {
				t.Fatalf("Run with stderr %q: ExitError.Stderr %q (%d bytes), want valid UTF-8 of at most %d bytes",
					stderr, ee.Stderr, len(ee.Stderr), 3*MaxStderr)
			}
			return
		}
		if err != nil {
			t.Fatalf("Run printing %d bytes = %v, want a reply", len(out), err)
		}
		got := resp.Text
		if !utf8.ValidString(got) {
			t.Fatalf("Run printing %q = %q, not valid UTF-8", short(out), short([]byte(got)))
		}
		if len(out) <= MaxReply {
			if want := strings.TrimRightFunc(strings.ToValidUTF8(string(out), "\uFFFD"), unicode.IsSpace); got != want {
				t.Fatalf("Run printing %q = %q, want %q", short(out), short([]byte(got)), short([]byte(want)))
			}
			return
		}
		// Past MaxReply: the first MaxReply bytes, less a rune the cut split and trailing white space.
		kept, ok := strings.CutSuffix(got, TruncatedSuffix)
		whole := strings.ToValidUTF8(string(out[:MaxReply]), "\uFFFD")
		rest, prefix := strings.CutPrefix(whole, kept)
		if !ok || !prefix || strings.TrimRightFunc(kept, unicode.IsSpace) != kept ||
			strings.TrimSpace(strings.TrimSuffix(rest, "\uFFFD")) != "" {
			t.Fatalf("Run printing %d bytes %q… = %d bytes ending %q, want a trimmed prefix of the first %d bytes and %q",
				len(out), short(out), len(got), got[max(0, len(got)-40):], MaxReply, TruncatedSuffix)
		}
	})
}

// short is b, cut for a failure message.
func short(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}
