package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
)

// TestMain clears the configuration a developer's environment may hold (AGENTGATE_STORE_DSN
// and the like), which this process's config loading and every daemon it starts would read:
// a test sets what it needs explicitly.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); config.IsEnvKey(name) {
			os.Unsetenv(name)
		}
	}
	os.Exit(pgtest.Main(m))
}

func TestRunCommands(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("sessions:\n  queue:\n    mode: fast\n    cap: 0\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("data_dir: "+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An openai agent whose key variable is not set: the config is fine, serve refuses to start.
	noKey := filepath.Join(dir, "openai.yaml")
	if err := os.WriteFile(noKey, []byte("data_dir: "+dir+"\nagent:\n  backend: openai\n  openai:\n    base_url: http://127.0.0.1:1/v1\n    model: m\n    api_key_env: AGENTGATE_TEST_UNSET_OPENAI_KEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Configurations serve refuses for their environment: check-config warns of each.
	public := filepath.Join(dir, "public.yaml")
	emptyToken := filepath.Join(dir, "empty-token.yaml")
	noBotToken := filepath.Join(dir, "discord.yaml")
	for path, text := range map[string]string{
		public:     "data_dir: " + dir + "\nhttp:\n  addr: 0.0.0.0:18050\n",
		emptyToken: "data_dir: " + dir + "\nhttp:\n  addr: 127.0.0.1:0\n  token_env: AGENTGATE_TEST_EMPTY_TOKEN\n",
		noBotToken: "data_dir: " + dir + "\nplatforms:\n  discord:\n    enabled: true\n    token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN\n",
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	noCommand := filepath.Join(dir, "exec.yaml")
	if err := os.WriteFile(noCommand, []byte("data_dir: "+dir+"\nagent:\n  backend: exec\n  exec:\n    command: ["+filepath.Join(dir, "no-agent")+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0") // another process's port
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	t.Setenv("AGENTGATE_TEST_EMPTY_TOKEN", "")
	t.Setenv("AGENTGATE_HTTP_ADR", "127.0.0.1:9") // a misspelt AGENTGATE_HTTP_ADDR
	tests := []struct {
		name       string
		args       []string
		wantErr    string // substring of the returned error; "" means success
		wantOut    string // substring of stdout
		wantStderr []string
		notStderr  []string // not in stderr
	}{
		{name: "version", args: []string{"version"}, wantOut: "agentgate "},
		{name: "--version is version, not a flag of serve", args: []string{"--version"}, wantOut: "agentgate "},
		{name: "-version too", args: []string{"-version"}, wantOut: "agentgate "},
		{name: "version takes no argument", args: []string{"version", "extra"}, wantErr: "usage", wantStderr: []string{`agentgate version: unexpected argument "extra"`}},
		{name: "version -h says what it does", args: []string{"version", "-h"}, wantStderr: []string{"usage: agentgate version\n\nPrints agentgate's version"}},
		{name: "a flag without a command says it went to serve", args: []string{"-v"}, wantErr: "usage",
			wantStderr: []string{"flag provided but not defined: -v", "No command was given, so the flags went to serve, the default command. 'agentgate -h' lists the commands."}},
		{name: "serve named says no more", args: []string{"serve", "-v"}, wantErr: "usage", wantStderr: []string{"flag provided but not defined: -v"},
			notStderr: []string{"No command was given"}},
		{name: "help", args: []string{"help"}, wantOut: "check-config"},
		{name: "help names every sessions command", args: []string{"help"}, wantOut: "list, show, export, search or reset the stored sessions; list and requeue\n                 quarantined messages"},
		{name: "-h lists the commands", args: []string{"-h"}, wantOut: "commands:\n  serve"},
		{name: "--help lists the commands", args: []string{"--help"}, wantOut: "commands:\n  serve"},
		{name: "help serve shows serve's flags", args: []string{"help", "serve"}, wantStderr: []string{"-http-addr"}},
		{name: "help of an unknown command", args: []string{"help", "frobnicate"}, wantErr: "usage", wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "serve -h does not start", args: []string{"serve", "-h"}, wantStderr: []string{"-http-addr"}},
		{name: "an admin command's help omits the flags that do nothing for it", args: []string{"sessions", "list", "-h"},
			wantStderr: []string{"-data-dir", "-platform"}, notStderr: []string{"-http-addr", "-log-level", "-log-format"}},
		{name: "backup's help omits them too", args: []string{"backup", "-h"},
			wantStderr: []string{"-data-dir"}, notStderr: []string{"-http-addr", "-log-level"}},
		{name: "sessions reset's help says what --http-addr is for", args: []string{"sessions", "reset", "-h"},
			wantStderr: []string{"the daemon's HTTP address for the curl command printed when its data directory records none; the command itself asks only a recorded address"}, notStderr: []string{"-log-level"}},
		{name: "an admin command still accepts them", args: []string{"sessions", "list", "--data-dir", filepath.Join(dir, "none"), "--log-level", "debug", "--http-addr", "127.0.0.1:1"},
			wantErr: "no database at"},
		{name: "unknown command", args: []string{"frobnicate"}, wantErr: "usage", wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "check-config ok", args: []string{"check-config", "--config", good}, wantOut: "config ok",
			wantStderr: []string{"warning: AGENTGATE_HTTP_ADR names no configuration key (a misspelt one?); it is ignored"}},
		{name: "check-config reports every problem", args: []string{"check-config", "--config", bad}, wantErr: "3 problem(s)",
			wantStderr: []string{"bogus", "sessions.queue.mode", "sessions.queue.cap"}},
		// One line, for the journal: before, the problems after the first were lines of their
		// own, without "agentgate: ".
		{name: "serve names every problem in one line", args: []string{"serve", "--config", bad},
			wantErr: `config has 3 problem(s): ` + bad + `:5: bogus: unknown key; ` + bad + `:3: sessions.queue.mode: "fast": must be one of`},
		{name: "an admin command too", args: []string{"sessions", "list", "--config", bad}, wantErr: `config has 3 problem(s): `},
		{name: "print defaults", args: []string{"check-config", "--print-defaults"}, wantOut: "passivate_after: 10m"},
		{name: "check-config warns of a missing API key", args: []string{"check-config", "--config", noKey}, wantOut: "config ok",
			wantStderr: []string{"warning: agent.openai.api_key_env: AGENTGATE_TEST_UNSET_OPENAI_KEY is not set"}},
		{name: "serve refuses an openai agent without its key", args: []string{"serve", "--config", noKey, "--http-addr", "127.0.0.1:0"},
			wantErr: "environment variable AGENTGATE_TEST_UNSET_OPENAI_KEY (agent.openai.api_key_env) holds no API key"},
		{name: "public address needs a token", args: []string{"serve", "--data-dir", dir, "--http-addr", "0.0.0.0:0"},
			wantErr: `config: http.addr: "0.0.0.0:0": is not a loopback address, where the API needs a bearer token: set http.token_env`},
		{name: "check-config refuses a public address without a token", args: []string{"check-config", "--config", public}, wantErr: "1 problem(s)",
			wantStderr: []string{"0.0.0.0:18050", "is not a loopback address, where the API needs a bearer token: set http.token_env"}},
		{name: "check-config takes a public address with a token", args: []string{"check-config", "--config", public, "--http-addr", "127.0.0.1:18050"}, wantOut: "config ok"},
		{name: "check-config warns of an empty token variable", args: []string{"check-config", "--config", emptyToken}, wantOut: "config ok",
			wantStderr: []string{"warning: http.token_env: AGENTGATE_TEST_EMPTY_TOKEN is not set here"}},
		{name: "serve refuses an empty token variable", args: []string{"serve", "--config", emptyToken}, wantErr: "http.token_env names AGENTGATE_TEST_EMPTY_TOKEN, which is not set or empty"},
		{name: "an empty --data-dir is an error, not the default", args: []string{"check-config", "--data-dir", ""}, wantErr: "config",
			wantStderr: []string{"data_dir: required"}},
		{name: "an empty --config is an error, not the defaults", args: []string{"serve", "--config", "", "--http-addr", "127.0.0.1:0"},
			wantErr: "--config names no file (it is empty)"},
		{name: "check-config too", args: []string{"check-config", "--config="}, wantErr: "1 problem(s)",
			wantStderr: []string{"--config names no file (it is empty)"}},
		{name: "bench refuses a data directory that holds data", args: []string{"bench", "--data-dir", dir, "--sessions", "1", "--messages", "1"},
			wantErr: "is not empty"},
		{name: "check-config warns of an exec command that is not there", args: []string{"check-config", "--config", noCommand}, wantOut: "config ok",
			wantStderr: []string{"warning: agent.exec.command: exec agent: command \"" + filepath.Join(dir, "no-agent") + "\" does not exist; serve refuses to start with it"}},
		{name: "serve refuses an exec command that is not there", args: []string{"serve", "--config", noCommand, "--http-addr", "127.0.0.1:0"},
			wantErr: "start: agent: exec agent: command \"" + filepath.Join(dir, "no-agent") + "\" does not exist"},
		{name: "serve says what to do when its port is taken", args: []string{"serve", "--data-dir", dir, "--http-addr", taken.Addr().String()},
			wantErr: "start: http.addr " + taken.Addr().String() + " is taken (stop what listens there, or give agentgate a free port with --http-addr, AGENTGATE_HTTP_ADDR or http.addr)"},
		{name: "check-config warns of a missing bot token", args: []string{"check-config", "--config", noBotToken}, wantOut: "config ok",
			wantStderr: []string{"warning: platforms.discord.token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN is not set here"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("run(%q) = %v, want success; stderr:\n%s", tt.args, err, stderr.String())
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("run(%q) = %v, want an error containing %q", tt.args, err, tt.wantErr)
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Errorf("run(%q) stdout = %q, want it to contain %q", tt.args, stdout.String(), tt.wantOut)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("run(%q) stderr = %q, want it to contain %q", tt.args, stderr.String(), w)
				}
			}
			for _, w := range tt.notStderr {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("run(%q) stderr = %q, want it without %q", tt.args, stderr.String(), w)
				}
			}
		})
	}
}
