package exec

import (
	"cmp"
	"fmt"
	"strings"
	"syscall"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
)

func TestHeadBuffer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		max    int
		writes []string
		want   string
	}{
		{name: "under the cap", max: 10, writes: []string{"ab", "cd\n \n"}, want: "abcd"},
		{name: "at the cap", max: 4, writes: []string{"ab", "cd"}, want: "abcd"},
		{name: "write crosses the cap", max: 4, writes: []string{"ab", "cdef"}, want: "abcd" + TruncatedSuffix},
		{name: "writes after the cap", max: 4, writes: []string{"abcd", "e", "f"}, want: "abcd" + TruncatedSuffix},
		{name: "white space before the cut", max: 4, writes: []string{"ab  x"}, want: "ab" + TruncatedSuffix},
		{name: "cut inside a rune", max: 4, writes: []string{"abcé"}, want: "abc" + TruncatedSuffix},
		{name: "cut inside a 4-byte rune", max: 3, writes: []string{"😀"}, want: TruncatedSuffix},
		{name: "cut after a whole rune", max: 5, writes: []string{"abcé!"}, want: "abcé" + TruncatedSuffix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &headBuffer{max: tc.max}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
				}
			}
			if got := w.reply(); got != tc.want {
				t.Errorf("reply() after %q = %q, want %q", tc.writes, got, tc.want)
			}
		})
	}
}

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		max    int
		writes []string
		want   string
	}{
		{name: "under the cap", max: 10, writes: []string{"ab", "cd"}, want: "abcd"},
		{name: "small writes over the cap", max: 4, writes: []string{"ab", "cd", "ef"}, want: "cdef"},
		{name: "one big write", max: 4, writes: []string{"a", "bcdefgh"}, want: "efgh"},
		{name: "cut inside a rune", max: 4, writes: []string{"éabc"}, want: "\uFFFDabc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &tailBuffer{max: tc.max}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
				}
			}
			if got := w.String(); got != tc.want {
				t.Errorf("String() after %q = %q, want %q", tc.writes, got, tc.want)
			}
		})
	}
}

func TestChildEnv(t *testing.T) {
	t.Parallel()
	parent := []string{
		"PATH=/bin",
		"AGENTGATE_SESSION_KEY=leaked",
		"HOME=/root",
		"AGENTGATE_FOO=x",
		"AGENTGATE_=y",
		"agentgate_lower=kept", // Variable names are case-sensitive: not ours.
		"DISCORD_TOKEN=secret", // withheld: the daemon's own secret
		"DISCORD_TOKEN_HINT=kept",
		"API_KEY=secret=with=equals",
	}
	id := identity.Turn{Platform: "http", SessionKey: "agent:main:http:dm:c1", TurnID: "t1"}
	got := childEnv(parent, []string{"DISCORD_TOKEN", "API_KEY"}, id)
	want := append([]string{"PATH=/bin", "HOME=/root", "agentgate_lower=kept", "DISCORD_TOKEN_HINT=kept"}, id.Env()...)
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("childEnv() mismatch (-want +got):\n%s", diff)
	}
	if parent[1] != "AGENTGATE_SESSION_KEY=leaked" {
		t.Errorf("childEnv() changed its parent slice: %q", parent)
	}
}

func TestEncodeInputArrays(t *testing.T) {
	t.Parallel()
	b, err := EncodeInput(&agents.Request{}, 5, 0)
	if err != nil {
		t.Fatalf("EncodeInput(empty request) error = %v, want nil", err)
	}
	s := string(b)
	if !strings.HasSuffix(s, "}\n") || strings.Count(s, "\n") != 1 {
		t.Errorf("EncodeInput(empty request) = %q, want one JSON object ending in a newline", s)
	}
	for _, want := range []string{`"messages":[]`, `"history":[]`} {
		if !strings.Contains(s, want) {
			t.Errorf("EncodeInput(empty request) = %q, want it to contain %s", s, want)
		}
	}
}

func TestExitErrorMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  *ExitError
		want string
	}{
		{name: "with stderr", err: &ExitError{Code: 2, Stderr: "bad thing\n"}, want: "exit status 2: bad thing"},
		{name: "without stderr", err: &ExitError{Code: 1}, want: "exit status 1"},
		{name: "killed", err: &ExitError{Code: 137, Signal: syscall.SIGKILL}, want: "killed by signal 9 (SIGKILL)"},
		{name: "killed, with stderr", err: &ExitError{Code: 143, Signal: syscall.SIGTERM, Stderr: "bye\n"}, want: "killed by signal 15 (SIGTERM): bye"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("%#v.Error() = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// TestRedact: what a failed command printed reaches the log without the daemon's secrets or
// what looks like a credential, and a tail cut inside a token starts after it. What counts as
// key-like is internal/redact's table; these are the agent's own parts: the withheld values and
// the cut tail.
func TestRedact(t *testing.T) {
	t.Parallel()
	env := map[string]string{"BOT_TOKEN": "MTA5.bot-token.xyz", "SHORT": "abc", "UNSET": "", "PGPASSWORD": "hunter2!correct-horse"}
	r := newRedactor([]string{"BOT_TOKEN", "SHORT", "UNSET", "PGPASSWORD"}, func(k string) string { return env[k] })
	tests := []struct {
		name   string
		max    int // of the tail buffer; 0: larger than the output
		output string
		want   string
	}{
		{name: "a withheld value", output: "login with MTA5.bot-token.xyz failed", want: "login with [redacted] failed"},
		{name: "a short value is left", output: "abc def", want: "abc def"},
		{name: "key-like strings (internal/redact's rules)", output: "Authorization: Bearer eyJhbGciOi.x-y postgres://agent:s3cret@db/x",
			want: "Authorization: Bearer [redacted] postgres://agent:[redacted]@db/x"},
		{name: "a URL cut before its password", max: 24, output: "postgres://agent:s3c!ret@db/x down\n", want: "…@db/x down\n"},
		{name: "a URL cut in its password", max: 15, output: "redis://u:p!ss@cache down\n", want: "…@cache down\n"},
		{name: "a URL cut in a password with / and ?", max: 18, output: "postgres://agent:ab/cd?ef==@db/x down\n", want: "…@db/x down\n"},
		{name: "a URL cut in its password before a long query", max: 14 + 300 + 6, output: "redis://u:p!ss@cache/0?q=" + strings.Repeat("a", 300) + " down\n",
			want: "…@cache/0?q=" + strings.Repeat("a", 300) + " down\n"},
		{name: "a cut token is dropped", max: 12, output: "Bearer abcdefgh done\n", want: "… done\n"},
		{name: "the cut end of a withheld value with punctuation", max: 24, output: "pw hunter2!correct-horse failed\n", want: "… failed\n"},
		{name: "a cut inside a rune", max: 5, output: "éé ok\n", want: " ok\n"},
		{name: "a long cut run is kept", max: maxFragment + 10, output: "x" + strings.Repeat("-", maxFragment+20) + "\n",
			want: strings.Repeat("-", maxFragment+9) + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &tailBuffer{max: cmp.Or(tc.max, 1<<10)}
			w.Write([]byte(tc.output))
			if got := r.tail(w); got != tc.want {
				t.Errorf("tail(%q) = %q, want %q", tc.output, got, tc.want)
			}
		})
	}
	if s := fmt.Sprintf("%v %+v", &Agent{redact: r}, &Agent{redact: r}); strings.Contains(s, env["BOT_TOKEN"]) {
		t.Errorf("%%v of the agent = %s, shows a withheld value", s)
	}
}
