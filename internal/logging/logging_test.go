package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
)

func TestNewJSON(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, slog.LevelInfo, "json")
	log.Debug("hidden")
	log.Info("session started", KeySession, "agent:main:http:dm:u1", Err(errors.New("boom")))

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
