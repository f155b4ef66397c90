package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestHelpOnStdoutAndUsageErrorsOnStderr runs the binary: the usage -h (--help, agentgate help
// CMD) asks for is the command's output, on stdout with exit status 0, as agentgate help's
// list of commands is; a wrong command line prints what is wrong and the usage on stderr, and
// exits 2; a command that fails exits 1. Before, -h printed on stderr (the flag package's
// default), and a wrong command line exited 1 as a failed command does.
func TestHelpOnStdoutAndUsageErrorsOnStderr(t *testing.T) {
	bin := MustBuild(t)
	dir := t.TempDir()
	tests := []struct {
		name      string
		args      []string
		code      int
		stdout    string // its start; "" for nothing
		stderrHas []string
	}{
		{name: "sessions show -h", args: []string{"sessions", "show", "-h"}, stdout: "usage: agentgate sessions show [flags] KEY\n"},
		{name: "sessions requeue --help", args: []string{"sessions", "requeue", "--help"}, stdout: "usage: agentgate sessions requeue [flags] KEY MESSAGE_ID\n"},
		{name: "backup -h", args: []string{"backup", "-h"}, stdout: "usage: agentgate backup"},
		{name: "bench -h", args: []string{"bench", "-h"}, stdout: "usage: agentgate bench [flags]"},
		{name: "serve -h", args: []string{"serve", "-h"}, stdout: "usage: agentgate serve [flags]"},
		{name: "help sessions list", args: []string{"help", "sessions", "list"}, stdout: "usage: agentgate sessions list [flags]"},
		{name: "-h", args: []string{"-h"}, stdout: "usage: agentgate <command> [flags]"},
		{name: "an unknown flag", args: []string{"sessions", "show", "--bogus"}, code: 2,
			stderrHas: []string{"flag provided but not defined: -bogus\n", "usage: agentgate sessions show [flags] KEY\n"}},
		{name: "a flag without its value", args: []string{"check-config", "--config"}, code: 2,
			stderrHas: []string{"flag needs an argument: -config\n", "usage: agentgate check-config [flags]"}},
		{name: "an unknown command", args: []string{"frobnicate"}, code: 2, stderrHas: []string{`agentgate: unknown command "frobnicate"`}},
		// A value the flag package parses but the command refuses, or an argument that cannot
		// be what the command takes, is a wrong command line too: before, it exited 1, as a
		// command that failed, while --limit abc exited 2.
		{name: "an unparsable value", args: []string{"sessions", "list", "--data-dir", dir, "--limit", "abc"}, code: 2,
			stderrHas: []string{`invalid value "abc" for flag -limit`}},
		{name: "a value out of range", args: []string{"sessions", "list", "--data-dir", dir, "--limit", "-1"}, code: 2,
			stderrHas: []string{"agentgate: sessions list: --limit -1: must be at least 1\n"}},
		{name: "bench's too", args: []string{"bench", "--sessions", "0"}, code: 2,
			stderrHas: []string{"agentgate: bench: --sessions 0: must be at least 1\n"}},
		{name: "a KEY that is no session key", args: []string{"sessions", "show", "--data-dir", dir, "alice"}, code: 2,
			stderrHas: []string{"agentgate: sessions show: identity: not a session key"}},
		{name: "an empty query", args: []string{"sessions", "search", "--data-dir", dir, " "}, code: 2,
			stderrHas: []string{"agentgate: sessions search: the query is empty\n"}},
		{name: "a command that fails", args: []string{"sessions", "list", "--data-dir", dir}, code: 1, stderrHas: []string{"agentgate: no database at "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, tc.args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if exit, ok := errors.AsType[*exec.ExitError](err); ok {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("agentgate %q exited %d, want %d; stderr:\n%s", tc.args, code, tc.code, stderr.String())
			}
			if tc.stdout == "" && stdout.Len() > 0 || !strings.HasPrefix(stdout.String(), tc.stdout) {
				t.Errorf("agentgate %q stdout = %q, want %q at its start", tc.args, stdout.String(), tc.stdout)
			}
			if tc.stdout != "" && stderr.Len() > 0 {
				t.Errorf("agentgate %q stderr = %q, want nothing beside the usage on stdout", tc.args, stderr.String())
			}
			for _, w := range tc.stderrHas {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("agentgate %q stderr = %q, want it to hold %q", tc.args, stderr.String(), w)
				}
			}
		})
	}
}
