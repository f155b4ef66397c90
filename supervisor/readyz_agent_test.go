package supervisor

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

// TestReadyzReportsAnAgentCommandThatCannotStart: the exec agent's program removed, or made
// unexecutable, while the daemon runs fails every turn, and /readyz says so under "agent" until
// the program is put right, without a turn that finds it so. Before, /readyz stayed ready while
// every turn failed (`fork/exec …: permission denied`).
func TestReadyzReportsAnAgentCommandThatCannotStart(t *testing.T) {
	t.Parallel()
	const script = "#!/bin/sh\necho hi\n"
	for _, tc := range []struct {
		name        string
		spoil, mend func(path string) error
		want        string
	}{
		{
			name:  "loses its execute bit",
			spoil: func(path string) error { return os.Chmod(path, 0o644) },
			mend:  func(path string) error { return os.Chmod(path, 0o755) },
			want:  "is not executable",
		},
		{
			name:  "removed",
			spoil: os.Remove,
			mend:  func(path string) error { return os.WriteFile(path, []byte(script), 0o755) },
			want:  "does not exist",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "agent")
			if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			r := MustStartDaemon(t, nil, daemonOpts{tweak: func(c *config.Config) {
				c.Agent.Backend = "exec"
				c.Agent.Exec.Command = []string{path}
			}})
			defer r.stop(t)
			if code, c := r.readyz(t); code != http.StatusOK || c["agent"] != "ok" {
				t.Fatalf("/readyz with the program in place = %d %v, want 200 with agent ok", code, c)
			}
			if err := tc.spoil(path); err != nil {
				t.Fatal(err)
			}
			r.inject(t, identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}, "m1", "hi")
			if out := r.waitSent(t, 1); out[0].Kind != platforms.KindNotice {
				t.Fatalf("reply to a turn whose program %s = %+v, want the failure notice", tc.name, out[0])
			}
			code, c := r.readyz(t)
			if code != http.StatusServiceUnavailable || !strings.Contains(c["agent"], tc.want) || !strings.Contains(c["agent"], "every turn fails (since ") {
				t.Errorf("/readyz once the program %s = %d %v, want 503 with agent: %q, every turn fails (since …)", tc.name, code, c, tc.want)
			}
			if err := tc.mend(path); err != nil {
				t.Fatal(err)
			}
			if code, c := r.readyz(t); code != http.StatusOK || c["agent"] != "ok" {
				t.Errorf("/readyz once the program is put right = %d %v, want 200 with agent ok", code, c)
			}
		})
	}
}
