package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestNewJSON(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, slog.LevelInfo, "json")
	log.Debug("hidden")
	log.Info("session started", KeySession, "agent:main:http:dm:u1", Err(errors.New("boom")),
		slog.Group("retry", "in", 1500*time.Millisecond))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1 (debug filtered out):\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("json.Unmarshal(%q) = %v, want nil", lines[0], err)
	}
	for key, want := range map[string]string{
		slog.LevelKey:   "INFO",
		slog.MessageKey: "session started",
		KeySession:      "agent:main:http:dm:u1",
		KeyErr:          "boom",
	} {
		if got := rec[key]; got != want {
			t.Errorf("record[%q] = %v, want %q", key, got, want)
		}
	}
	// A duration reads as in the text log, with its unit, also in a group.
	if got, want := rec["retry"], map[string]any{"in": "1.5s"}; !reflect.DeepEqual(got, want) {
		t.Errorf("record[retry] = %v, want %v", got, want)
	}
}

func TestNewText(t *testing.T) {
	for _, format := range []string{"text", ""} {
		t.Run("format="+format, func(t *testing.T) {
			var lv slog.LevelVar
			lv.Set(slog.LevelWarn)
			var buf bytes.Buffer
			log := New(&buf, &lv, format)
			log.Info("hidden")
			lv.Set(slog.LevelDebug)
			log.Debug("turn ended", KeyTurn, 7, Err(errors.New("boom")))

			got := buf.String()
			if strings.Contains(got, "hidden") {
				t.Errorf("output %q contains a line below the level", got)
			}
			if strings.Contains(got, "\x1b[") {
				t.Errorf("output %q contains ANSI escapes, want none for a non-terminal", got)
			}
			for _, want := range []string{"DBG", "turn ended", "turn=7", "err=boom"} {
				if !strings.Contains(got, want) {
					t.Errorf("output %q lacks %q", got, want)
				}
			}
		})
	}
}

func TestIsTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Errorf("IsTerminal(regular file) = true, want false")
	}
	if IsTerminal(&bytes.Buffer{}) {
		t.Errorf("IsTerminal(*bytes.Buffer) = true, want false")
	}
}

// TestColouredTextWritesNoEscapesOfItsValues: on a terminal, a logged value cannot write an
// escape sequence. tint's colours re-insert every \x1b of a quoted value as a raw ESC: before,
// an agent's stderr holding an ESC, or an HTTP chat id holding the four characters \x1b and a
// space, cleared the operator's screen.
func TestColouredTextWritesNoEscapesOfItsValues(t *testing.T) {
	var buf bytes.Buffer
	log := newText(&buf, slog.LevelInfo, true)
	log.Info("turn failed",
		KeySession, `agent:main:http:dm:\x1b[2J\x1b[31m EVIL`,
		"stderr", []byte("\x1b]0;pwned\x1b\\ out"),
		Err(errors.New("exit 1: \x1b[1A\x1b[2KINF fake line")),
		"detail", "\x1b[2J")
	got := buf.String()
	for _, evil := range []string{"\x1b[2J", "\x1b[31m EVIL", "\x1b]0;", "\x1b[1A", "\x1b[2K"} {
		if strings.Contains(got, evil) {
			t.Errorf("coloured output %q holds the value's escape %q", got, evil)
		}
	}
	for _, want := range []string{`\\x1B[2J\\x1B[31m EVIL`, `␛]0;pwned`, `␛[1A␛[2KINF fake line`, `detail=` + "\x1b[0m" + `␛[2J`, "\x1b[2;91merr="} {
		if !strings.Contains(got, want) {
			t.Errorf("coloured output %q lacks %q", got, want)
		}
	}
}
