package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMaxInMemory: sessions.max_in_memory bounds the sessions in memory by default, 0 turns the
// bound off, and a negative bound is refused with its field name.
func TestMaxInMemory(t *testing.T) {
	if got := Default().Sessions.MaxInMemory; got != 100_000 {
		t.Errorf("Default().Sessions.MaxInMemory = %d, want 100000", got)
	}
	for _, tc := range []struct {
		name, value string
		want        int
		problem     string
	}{
		{"off", "0", 0, ""},
		{"small", "3", 3, ""},
		{"negative", "-1", 0, "sessions.max_in_memory: -1: must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte("sessions:\n  max_in_memory: "+tc.value+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := Load(path, nil, nil)
			if tc.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tc.problem) {
					t.Fatalf("Load(max_in_memory: %s) error = %v, want one containing %q", tc.value, err, tc.problem)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load(max_in_memory: %s) error = %v, want nil", tc.value, err)
			}
			if got := cfg.Sessions.MaxInMemory; got != tc.want {
				t.Errorf("Load(max_in_memory: %s).Sessions.MaxInMemory = %d, want %d", tc.value, got, tc.want)
			}
		})
	}
}
