package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
)

// TestStopThatCannotCountTheSpoolSaysSo: a stop that cannot read the spool's directory to count
// the writes left there says so at WARN, and that any there are replayed at the next start,
// instead of `INF stopped`. Before, it warned that it could not count them and then logged
// "stopped", as if nothing waited.
func TestStopThatCannotCountTheSpoolSaysSo(t *testing.T) {
	const want = `level=WARN msg="stopped, but the writes left in the spool could not be counted; any there are replayed at the next start before any session loads"`
	dir := t.TempDir()
	var logs logSignal
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: &logs})
	r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)
	// The directory cannot be read (its owner or mode, a failing disk; here a file in its
	// place, which root cannot read as a directory either).
	sp := filepath.Join(dir, "spool")
	if err := os.Rename(sp, sp+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.stop(t)
	got := logs.String()
	if !strings.Contains(got, want) || !strings.Contains(got, "dir="+sp) || strings.Contains(got, `level=INFO msg=stopped`) {
		t.Errorf("the stop's log:\n%s\nwant %q with dir=%s, and no INFO stopped", got, want, sp)
	}
}
