package actors

import (
	"strings"
	"testing"
)

// FuzzParseCommand: a text is a command only when it starts, after white space, with "/" and a
// name of letters, digits and underscores; the name comes back lower case and the arguments
// trimmed, and writing the command out again parses to the same command.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		"/new", " /STATUS ", "/title  My  chat ", "/queue\tcollect", "/resume\n20261110_120000_ab12cd34",
		"/etc/passwd is here", "/", "//", "/ x", "/\n", "/tïtle x", "hello /new", "/new\x00", "/Ünknown",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		cmd, ok := parseCommand(text)
		if !ok {
			if cmd != (command{}) {
				t.Fatalf("parseCommand(%q) = %+v, false; want the zero command", text, cmd)
			}
			return
		}
		if !strings.HasPrefix(strings.TrimSpace(text), "/") {
			t.Fatalf("parseCommand(%q) = %+v, a command without a leading slash", text, cmd)
		}
		if cmd.name == "" { // "/ x" is text for the agent, not "Unknown command /."
			t.Fatalf("parseCommand(%q) = %+v, a command without a name", text, cmd)
		}
		for _, r := range cmd.name {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				t.Fatalf("parseCommand(%q): name %q, want lower-case letters, digits and underscores", text, cmd.name)
			}
		}
		if strings.TrimSpace(cmd.args) != cmd.args {
			t.Fatalf("parseCommand(%q): args %q, want them trimmed", text, cmd.args)
		}
		line := "/" + cmd.name
		if cmd.args != "" {
			line += " " + cmd.args
		}
		if again, ok := parseCommand(line); !ok || again != cmd {
			t.Fatalf("parseCommand(%q) = %+v, but parseCommand(%q) = %+v, %v", text, cmd, line, again, ok)
		}
	})
}
