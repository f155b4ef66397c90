package exec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindCommandChecksTheFormat: a file the kernel will not run although it is executable (a
// script without #!, which a shell runs but execve refuses with ENOEXEC, or whose interpreter
// is missing, which execve reports as ENOENT) is refused when the agent is made, with a reason,
// instead of failing every turn with a puzzling error.
func TestFindCommandChecksTheFormat(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		content string
		wantErr string // "" means success
	}{
		{name: "shell script", content: "#!/bin/sh\necho hi\n"},
		{name: "interpreter with an argument", content: "#! /bin/sh -eu\necho hi\n"},
		{name: "a program", content: "\x7fELF\x02\x01\x01\x00"},
		{name: "no #! line", content: "echo hi\n", wantErr: "has no #! line"},
		{name: "empty", content: "", wantErr: "has no #! line"},
		{name: "CRLF line ends", content: "#!/bin/sh\r\necho hi\r\n", wantErr: `does not exist: "/bin/sh\r"`},
		{name: "interpreter after a tab", content: "#!\t/bin/sh\n"},
		{name: "missing interpreter", content: "#!/nonexistent/bin/sh\necho hi\n", wantErr: "the interpreter its #! line names does not exist"},
		{name: "interpreter not executable", content: "#!" + plain + "\necho hi\n", wantErr: "is not executable"},
		{name: "interpreter is a directory", content: "#!" + dir + "\n", wantErr: "is not executable"},
		{name: "no interpreter", content: "#!\necho hi\n", wantErr: "names no interpreter"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, "agent"+string(rune('a'+i)))
			if err := os.WriteFile(path, []byte(tc.content), 0o755); err != nil {
				t.Fatal(err)
			}
			err := FindCommand(path, "")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("FindCommand(%q) = %v, want success", tc.content, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("FindCommand(%q) = %v, want an error containing %q", tc.content, err, tc.wantErr)
			}
		})
	}
}

// TestBinfmtMatches: a file without #! that a binfmt_misc handler takes is run by the kernel,
// so the format check must let it pass; an entry that does not take it changes nothing.
func TestBinfmtMatches(t *testing.T) {
	t.Parallel()
	jar := []byte("PK\x03\x04rest")
	tests := []struct {
		name, entry, path string
		head              []byte
		want              bool
	}{
		{name: "magic", entry: "enabled\ninterpreter /usr/bin/jexec\nflags: \noffset 0\nmagic 504b0304\n", path: "/a/app.jar", head: jar, want: true},
		{name: "other magic", entry: "enabled\ninterpreter /usr/bin/wine\nflags: \noffset 0\nmagic 4d5a\n", path: "/a/app.jar", head: jar},
		{name: "magic with a mask", entry: "enabled\noffset 1\nmagic 4a03\nmask 5eff\n", path: "/a/x", head: jar, want: true},
		{name: "magic past the head", entry: "enabled\noffset 300\nmagic 00\n", path: "/a/x", head: jar},
		{name: "disabled", entry: "disabled\ninterpreter /usr/bin/jexec\noffset 0\nmagic 504b0304\n", path: "/a/app.jar", head: jar},
		{name: "extension", entry: "enabled\ninterpreter /usr/bin/python3\nflags: \nextension .py\n", path: "/a/agent.py", head: []byte("print(1)\n"), want: true},
		{name: "other extension", entry: "enabled\ninterpreter /usr/bin/python3\nflags: \nextension .py\n", path: "/a/agent.sh", head: []byte("echo\n")},
		{name: "unreadable", entry: "enabled\noffset 0\nmagic zz\n", path: "/a/x", head: jar, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := binfmtMatches(tc.entry, tc.path, tc.head); got != tc.want {
				t.Errorf("binfmtMatches(%q, %q) = %v, want %v", tc.entry, tc.path, got, tc.want)
			}
		})
	}
}
