package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/supervisor"
)

// TestMain clears the configuration a developer's environment may hold (AGENTGATE_STORE_DSN
// and the like), which this process's config loading and every daemon it starts would read:
// a test sets what it needs explicitly. The binary MustBuild built is removed once the tests
// are done: before, each run left its 45 to 62 MB in the temporary directory, and a day of runs
// filled the disk.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); config.IsEnvKey(name) {
			os.Unsetenv(name)
		}
	}
	code := pgtest.Main(m)
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
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
	// Configurations serve refuses for their environment: check-config refuses each too.
	public := filepath.Join(dir, "public.yaml")
	emptyToken := filepath.Join(dir, "empty-token.yaml")
	noBotToken := filepath.Join(dir, "discord.yaml")
	prefixBotToken := filepath.Join(dir, "discord-prefix.yaml")
	// A token in a variable the file names, which is AGENTGATE_-prefixed as a config key's is.
	fileToken := filepath.Join(dir, "file-token.yaml")
	for path, text := range map[string]string{
		public:         "data_dir: " + dir + "\nhttp:\n  addr: 0.0.0.0:18050\n",
		emptyToken:     "data_dir: " + dir + "\nhttp:\n  addr: 127.0.0.1:0\n  token_env: AGENTGATE_TEST_EMPTY_TOKEN\n",
		fileToken:      "data_dir: " + dir + "\nhttp:\n  addr: 127.0.0.1:0\n  token_env: AGENTGATE_HTTP_BEARER\n",
		noBotToken:     "data_dir: " + dir + "\nplatforms:\n  discord:\n    enabled: true\n    token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN\n",
		prefixBotToken: "data_dir: " + dir + "\nplatforms:\n  discord:\n    enabled: true\n    token_env: AGENTGATE_TEST_PREFIX_BOT_TOKEN\n",
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
	t.Setenv("AGENTGATE_TEST_PREFIX_BOT_TOKEN", "Bot \n") // the header's prefix, the token left out
	t.Setenv("AGENTGATE_HTTP_BEARER", "a-token-of-the-file-s-own-variable")
	t.Setenv("AGENTGATE_HTTP_ADR", "127.0.0.1:9") // a misspelt AGENTGATE_HTTP_ADDR
	tests := []struct {
		name       string
		args       []string
		wantErr    string // substring of the returned error; "" means success
		wantOut    string // substring of stdout
		wantStderr []string
		notStderr  []string // not in stderr
		wantUsage  []string // in stdout, with nothing on stderr: the usage -h asks for
		notUsage   []string // not in stdout
	}{
		{name: "version", args: []string{"version"}, wantOut: "agentgate "},
		{name: "--version is version, not a flag of serve", args: []string{"--version"}, wantOut: "agentgate "},
		{name: "-version too", args: []string{"-version"}, wantOut: "agentgate "},
		// An extra argument points to -h, as a missing one does: before, it was named alone.
		{name: "version takes no argument", args: []string{"version", "extra"}, wantErr: "usage",
			wantStderr: []string{`agentgate version: unexpected argument "extra" (agentgate version -h says what it takes)` + "\n"}},
		{name: "an argument past KEY", args: []string{"sessions", "show", "--data-dir", dir, keyA, "extra"}, wantErr: "usage",
			wantStderr: []string{`agentgate sessions show: unexpected argument "extra" (agentgate sessions show -h says what it takes)` + "\n"}},
		{name: "an argument where none is taken", args: []string{"sessions", "list", "--data-dir", dir, "extra"}, wantErr: "usage",
			wantStderr: []string{`agentgate sessions list: unexpected argument "extra" (agentgate sessions list -h says what it takes)` + "\n"}},
		{name: "pardon of --all and a KEY", args: []string{"sessions", "pardon", "--data-dir", dir, "--all", keyA}, wantErr: "usage",
			wantStderr: []string{"agentgate sessions pardon: give --all or a KEY, not both (agentgate sessions pardon -h says what they are)\n"}},
		{name: "version -h says what it does", args: []string{"version", "-h"}, wantUsage: []string{"usage: agentgate version\n\nPrints agentgate's version"}},
		{name: "a flag without a command says it went to serve", args: []string{"-v"}, wantErr: "usage",
			wantStderr: []string{"flag provided but not defined: -v", "No command was given, so the flags went to serve, the default command. 'agentgate -h' lists the commands."}},
		{name: "serve named says no more", args: []string{"serve", "-v"}, wantErr: "usage", wantStderr: []string{"flag provided but not defined: -v"},
			notStderr: []string{"No command was given"}},
		{name: "help", args: []string{"help"}, wantOut: "check-config"},
		{name: "help names every sessions command", args: []string{"help"}, wantOut: "list, show, export, search or reset the stored sessions; list and requeue\n                 quarantined messages; pardon messages struck by unclean stops"},
		{name: "-h lists the commands", args: []string{"-h"}, wantOut: "commands:\n  serve"},
		{name: "--help lists the commands", args: []string{"--help"}, wantOut: "commands:\n  serve"},
		{name: "help serve shows serve's flags", args: []string{"help", "serve"}, wantUsage: []string{"-http-addr"}},
		{name: "help of an unknown command", args: []string{"help", "frobnicate"}, wantErr: "usage", wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "serve -h does not start", args: []string{"serve", "-h"}, wantUsage: []string{"-http-addr"}},
		// As every other command's help: before, Go's bare "Usage of serve:" and the flags.
		{name: "serve's help says what it does", args: []string{"help", "serve"},
			wantUsage: []string{"usage: agentgate serve [flags]\n\nRuns the daemon", "exits at once (a SIGHUP never does)", "\nflags:\n  -config file"}, notUsage: []string{"Usage of"}},
		{name: "check-config's too", args: []string{"check-config", "-h"},
			wantUsage: []string{"usage: agentgate check-config [flags]\n\nValidates the configuration", "\nflags:\n  -config file", "-print-defaults"}, notUsage: []string{"Usage of"}},
		{name: "bench's too", args: []string{"bench", "-h"},
			wantUsage: []string{"usage: agentgate bench [flags]\n\nMeasures the whole runtime", "\nflags:\n  -config file", "-sessions N"}, notUsage: []string{"Usage of"}},
		{name: "an admin command's help omits the flags that do nothing for it", args: []string{"sessions", "list", "-h"},
			wantUsage: []string{"-data-dir", "-platform"}, notUsage: []string{"-http-addr", "-log-level", "-log-format"}},
		{name: "backup's help omits them too", args: []string{"backup", "-h"},
			wantUsage: []string{"-data-dir"}, notUsage: []string{"-http-addr", "-log-level"}},
		{name: "sessions reset's help says what --http-addr is for", args: []string{"sessions", "reset", "-h"},
			wantUsage: []string{"the daemon's HTTP address for the curl command printed when its data directory records none; the command itself asks only a recorded address"}, notUsage: []string{"-log-level"}},
		{name: "an admin command still accepts them", args: []string{"sessions", "list", "--data-dir", filepath.Join(dir, "none"), "--log-level", "debug", "--http-addr", "127.0.0.1:1"},
			wantErr: "no database at"},
		// Before, only the flags: the arguments they go with went unsaid (found by an audit).
		{name: "a sessions command's help names its argument", args: []string{"sessions", "show", "-h"},
			wantUsage: []string{"usage: agentgate sessions show [flags] KEY\n", "KEY is a session key (agent:<profile>:<platform>:<chat type>:<chat id>[:...]), as sessions list\nprints it", "\nflags:\n  -config file"}},
		{name: "and all of them", args: []string{"sessions", "requeue", "-h"},
			wantUsage: []string{"usage: agentgate sessions requeue [flags] KEY MESSAGE_ID\n", "sessions quarantined prints both", "KEY is a session key"}},
		// Before, help of a sessions command printed the sessions commands' list.
		{name: "help of a sessions command is that command's", args: []string{"help", "sessions", "show"},
			wantUsage: []string{"usage: agentgate sessions show [flags] KEY\n"}, notUsage: []string{"commands:"}},
		{name: "sessions -help is help", args: []string{"sessions", "-help"}, wantOut: "usage: agentgate sessions <command>"},
		// Before, the usage alone, which did not say what was wrong.
		{name: "a flag before the sessions command says so", args: []string{"sessions", "--data-dir", dir, "list"}, wantErr: "usage",
			wantStderr: []string{`agentgate sessions: the command comes first, then its flags (agentgate sessions list --data-dir DIR); got the flag "--data-dir" first`,
				"usage: agentgate sessions <command>"}},
		{name: "a missing KEY says where it is explained", args: []string{"sessions", "show", "--data-dir", dir}, wantErr: "usage",
			wantStderr: []string{"agentgate sessions show: missing KEY (agentgate sessions show -h says what it is)\n"}},
		{name: "so does requeue's", args: []string{"sessions", "requeue", "--data-dir", dir, keyA}, wantErr: "usage",
			wantStderr: []string{"agentgate sessions requeue: want KEY MESSAGE_ID, got 1 argument(s) (agentgate sessions requeue -h says what they are)\n"}},
		// backup "$FILE" with FILE unset: before, "to :  is a directory".
		{name: "backup to an empty FILE says so", args: []string{"backup", "--data-dir", dir, ""},
			wantErr: "backup: FILE is empty: name the file to write"},
		{name: "backup's help says whose the restored copy must be", args: []string{"backup", "-h"},
			wantUsage: []string{"copy FILE to\nagentgate.db as the daemon's user"}},
		{name: "search's names the query", args: []string{"sessions", "search", "--help"}, wantUsage: []string{"usage: agentgate sessions search [flags] QUERY\n"}},
		{name: "one without an argument names none", args: []string{"sessions", "quarantined", "-h"}, wantUsage: []string{"usage: agentgate sessions quarantined [flags]\n\nLists quarantined messages"}},
		{name: "unknown command", args: []string{"frobnicate"}, wantErr: "usage", wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "check-config ok", args: []string{"check-config", "--config", good}, wantOut: "config ok",
			wantStderr: []string{"warning: AGENTGATE_HTTP_ADR names no configuration key (did you mean AGENTGATE_HTTP_ADDR?); it is ignored"}},
		// Before, the token variable http.token_env names was warned of as a misspelt key.
		{name: "check-config knows the variable a file's token_env names", args: []string{"check-config", "--config", fileToken}, wantOut: "config ok",
			notStderr: []string{"AGENTGATE_HTTP_BEARER"}},
		{name: "check-config reports every problem", args: []string{"check-config", "--config", bad}, wantErr: "3 problem(s)",
			wantStderr: []string{"bogus", "sessions.queue.mode", "sessions.queue.cap"}},
		// Counted as check-config counts them; main prints each before (TestServePrintsEachConfigProblem).
		{name: "serve counts the problems", args: []string{"serve", "--config", bad}, wantErr: `config has 3 problem(s)`},
		{name: "an admin command too", args: []string{"sessions", "list", "--config", bad}, wantErr: `config has 3 problem(s)`},
		{name: "print defaults", args: []string{"check-config", "--print-defaults"}, wantOut: "passivate_after: 10m"},
		{name: "check-config refuses a missing API key", args: []string{"check-config", "--config", noKey}, wantErr: "serve would refuse to start here: 1 problem(s)",
			wantStderr: []string{"agent.openai.api_key_env: AGENTGATE_TEST_UNSET_OPENAI_KEY is not set"}, notStderr: []string{"warning: agent.openai"}},
		{name: "check-config --config-only warns of it", args: []string{"check-config", "--config-only", "--config", noKey}, wantOut: "config ok",
			wantStderr: []string{"warning: " + noKey + ":7: agent.openai.api_key_env: AGENTGATE_TEST_UNSET_OPENAI_KEY is not set"}},
		{name: "serve refuses an openai agent without its key", args: []string{"serve", "--config", noKey, "--http-addr", "127.0.0.1:0"},
			wantErr: noKey + ":7: agent.openai.api_key_env: AGENTGATE_TEST_UNSET_OPENAI_KEY is not set here; serve refuses to start without the API key (for a server that takes none, set agent.openai.api_key_env: \"\")"},
		{name: "public address needs a token", args: []string{"serve", "--data-dir", dir, "--http-addr", "0.0.0.0:0"},
			wantErr: `config: http.addr: "0.0.0.0:0": is not a loopback address, where the API needs a bearer token: set http.token_env`},
		{name: "check-config refuses a public address without a token", args: []string{"check-config", "--config", public}, wantErr: "1 problem(s)",
			wantStderr: []string{"0.0.0.0:18050", "is not a loopback address, where the API needs a bearer token: set http.token_env"}},
		{name: "check-config takes a public address with a token", args: []string{"check-config", "--config", public, "--http-addr", "127.0.0.1:18050"}, wantOut: "config ok"},
		{name: "check-config refuses an empty token variable", args: []string{"check-config", "--config", emptyToken}, wantErr: "serve would refuse to start here: 1 problem(s)",
			wantStderr: []string{"http.token_env: AGENTGATE_TEST_EMPTY_TOKEN is not set here"}},
		// One run names them all: before, the unset variable was named once the file was fixed.
		{name: "check-config names a file's problems and the environment's at once", args: []string{"check-config", "--config", emptyToken, "--log-level", "loud"},
			wantErr:    "config has 1 problem(s), and serve would refuse to start here for 1 more (--config-only checks the configuration alone)",
			wantStderr: []string{"log.level", "http.token_env: AGENTGATE_TEST_EMPTY_TOKEN is not set here"}},
		// A flag's value is said to be the flag's, as a variable's is (before, the key alone).
		{name: "a flag's bad value names the flag", args: []string{"check-config", "--data-dir", dir, "--log-level", "loud"}, wantErr: "config has 1 problem(s)",
			wantStderr: []string{`log.level: "loud": must be one of debug, info, warn, error (in any case) (set by --log-level)` + "\n"}},
		{name: "serve's too", args: []string{"serve", "--data-dir", dir, "--http-addr", "127.0.0.1:0", "--log-format", "xml"},
			wantErr: `config: log.format: "xml": must be one of text, json (set by --log-format)`},
		// At the file's line of the key, as check-config says it: before, without it.
		{name: "serve refuses an empty token variable", args: []string{"serve", "--config", emptyToken},
			wantErr: emptyToken + ":4: http.token_env: AGENTGATE_TEST_EMPTY_TOKEN is not set here; serve refuses to start without the bearer token (set it, or remove http.token_env to serve without a token, on a loopback address only)"},
		{name: "an empty --data-dir is an error, not the default", args: []string{"check-config", "--data-dir", ""}, wantErr: "config",
			wantStderr: []string{"data_dir: required"}},
		{name: "an empty --config is an error, not the defaults", args: []string{"serve", "--config", "", "--http-addr", "127.0.0.1:0"},
			wantErr: "--config names no file (it is empty)"},
		{name: "check-config too", args: []string{"check-config", "--config="}, wantErr: "1 problem(s)",
			wantStderr: []string{"--config names no file (it is empty)"}},
		{name: "bench refuses a data directory that holds data", args: []string{"bench", "--data-dir", dir, "--sessions", "1", "--messages", "1"},
			wantErr: "is not empty"},
		{name: "check-config refuses an exec command that is not there", args: []string{"check-config", "--config", noCommand}, wantErr: "serve would refuse to start here: 1 problem(s)",
			wantStderr: []string{"agent.exec.command: exec agent: command \"" + filepath.Join(dir, "no-agent") + "\" does not exist; serve refuses to start with it"}},
		{name: "serve refuses an exec command that is not there", args: []string{"serve", "--config", noCommand, "--http-addr", "127.0.0.1:0"},
			wantErr: noCommand + ":5: agent.exec.command: exec agent: command \"" + filepath.Join(dir, "no-agent") + "\" does not exist; serve refuses to start with it"},
		{name: "serve says what to do when its port is taken", args: []string{"serve", "--data-dir", dir, "--http-addr", taken.Addr().String()},
			wantErr: "start: http.addr " + taken.Addr().String() + " is taken (stop what listens there, or give agentgate a free port with --http-addr, AGENTGATE_HTTP_ADDR or http.addr)"},
		{name: "check-config refuses a missing bot token", args: []string{"check-config", "--config", noBotToken}, wantErr: "serve would refuse to start here: 1 problem(s)",
			wantStderr: []string{"platforms.discord.token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN is not set here"}},
		{name: "serve refuses a missing bot token", args: []string{"serve", "--config", noBotToken, "--http-addr", "127.0.0.1:0"},
			wantErr: noBotToken + ":5: platforms.discord.token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN is not set here; serve refuses to start without the bot token (set it to the bot token, from the Developer Portal's Bot page, or set platforms.discord.enabled: false)"},
		// Before, the prefix alone passed both, and was sent as the token "Bot".
		{name: "check-config refuses a bot token of the prefix alone", args: []string{"check-config", "--config", prefixBotToken}, wantErr: "serve would refuse to start here: 1 problem(s)",
			wantStderr: []string{`platforms.discord.token_env: AGENTGATE_TEST_PREFIX_BOT_TOKEN holds the prefix "Bot" alone, without the token; serve refuses to start without the bot token`}},
		// One line naming the file: before, "config: load config: open …".
		{name: "serve names a missing config file", args: []string{"serve", "--config", filepath.Join(dir, "nope.yaml")},
			wantErr: "config: read " + filepath.Join(dir, "nope.yaml") + ": no such file or directory"},
		{name: "check-config names a missing config file", args: []string{"check-config", "--config", filepath.Join(dir, "nope.yaml")}, wantErr: "config has 1 problem(s)",
			wantStderr: []string{"read " + filepath.Join(dir, "nope.yaml") + ": no such file or directory\n"}, notStderr: []string{"load config"}},
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
			for _, w := range tt.wantUsage {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("run(%q) stdout = %q, want the usage, with %q", tt.args, stdout.String(), w)
				}
			}
			if tt.wantUsage != nil && stderr.Len() > 0 {
				t.Errorf("run(%q) stderr = %q, want nothing there: the usage -h asks for is the command's output", tt.args, stderr.String())
			}
			for _, w := range tt.notUsage {
				if strings.Contains(stdout.String(), w) {
					t.Errorf("run(%q) stdout = %q, want it without %q", tt.args, stdout.String(), w)
				}
			}
		})
	}
}

// TestCheckConfig: check-config exits non-zero, naming the problem as serve does, for what serve
// refuses at start beyond validation (before, it said "config ok" and warned, found by an
// audit); --config-only keeps that to warnings, for a file checked elsewhere than where it runs.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	check := func(t *testing.T, args ...string) (stdout, stderr string, err error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err = run(context.Background(), append([]string{"check-config"}, args...), &out, &errOut)
		return out.String(), errOut.String(), err
	}

	t.Run("the exec agent's command in serve's words", func(t *testing.T) {
		path := write("exec.yaml", "data_dir: "+dir+"\nagent:\n  backend: exec\n  exec:\n    command: ["+filepath.Join(dir, "gone")+"]\n")
		var out, errOut bytes.Buffer
		serveErr := run(context.Background(), []string{"serve", "--config", path, "--http-addr", "127.0.0.1:0"}, &out, &errOut)
		want := path + ":5: agent.exec.command: exec agent: command \"" + filepath.Join(dir, "gone") + "\" does not exist; serve refuses to start with it"
		if serveErr == nil || serveErr.Error() != want {
			t.Fatalf("serve = %v, want %q", serveErr, want)
		}
		_, stderr, err := check(t, "--config", path)
		if err == nil || stderr != want+"\n" {
			t.Errorf("check-config = %v, stderr %q; want an error, and serve's %q", err, stderr, want)
		}
	})

	// Each on a line of its own, as a configuration's problems are: before, Start refused the
	// first it met.
	t.Run("serve names every refusal", func(t *testing.T) {
		path := write("exec-discord.yaml", "data_dir: "+dir+"\nagent:\n  backend: exec\n  exec:\n    command: ["+filepath.Join(dir, "gone")+"]\n"+
			"platforms:\n  discord: {enabled: true, token_env: AGENTGATE_TEST_UNSET_BOT_TOKEN}\n")
		var out, errOut bytes.Buffer
		serveErr := run(context.Background(), []string{"serve", "--config", path, "--http-addr", "127.0.0.1:0"}, &out, &errOut)
		if serveErr == nil || serveErr.Error() != "serve refuses to start here: 2 problem(s)" {
			t.Fatalf("serve = %v, want both refused", serveErr)
		}
		var printed bytes.Buffer
		printError(&printed, serveErr)
		lines := strings.Split(strings.TrimSuffix(printed.String(), "\n"), "\n")
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "agentgate: "+path+":5: agent.exec.command: ") ||
			!strings.HasPrefix(lines[1], "agentgate: "+path+":7: platforms.discord.token_env: ") {
			t.Errorf("serve printed %q, want each refusal at its line, then the count", printed.String())
		}
	})

	t.Run("an exec agent without a command was refused already", func(t *testing.T) {
		path := write("nocommand.yaml", "data_dir: "+dir+"\nagent:\n  backend: exec\n")
		if _, stderr, err := check(t, "--config", path); err == nil || !strings.Contains(stderr, "agent.exec.command: required when agent.backend is exec") {
			t.Errorf("check-config = %v, stderr %q; want the command required", err, stderr)
		}
	})

	t.Run("a secret's variable named wrong is one problem", func(t *testing.T) {
		// Before, the name the validation refused was looked up too, for a second problem:
		// "platforms.discord.token_env:  is not set here; serve refuses to start without the bot
		// token" (an empty name), "$DISCORD_TOKEN is not set here" (the name written with its $).
		for name, value := range map[string]string{
			"empty":      `""`,
			"with its $": `$DISCORD_TOKEN`,
		} {
			path := write("discord-env.yaml", "data_dir: "+dir+"\nplatforms:\n  discord:\n    enabled: true\n    token_env: "+value+"\n")
			_, stderr, err := check(t, "--config", path)
			if err == nil || err.Error() != "config has 1 problem(s)" || strings.Count(stderr, "platforms.discord.token_env") != 1 {
				t.Errorf("%s: check-config = %v, stderr %q; want one problem, of platforms.discord.token_env", name, err, stderr)
			}
		}
	})

	t.Run("an unset API key is told of a server that takes none", func(t *testing.T) {
		// Before, only "serve refuses to start without the API key", to an operator of a local
		// model server, which takes none (found by a new operator's walkthrough).
		path := write("openai-key.yaml", "data_dir: "+dir+"\nagent:\n  backend: openai\n  openai: {base_url: \"http://127.0.0.1:1/v1\", model: m, api_key_env: AGENTGATE_TEST_UNSET_MODEL_KEY}\n")
		want := `openai-key.yaml:4: agent.openai.api_key_env: AGENTGATE_TEST_UNSET_MODEL_KEY is not set here; serve refuses to start without the API key (for a server that takes none, set agent.openai.api_key_env: "")`
		if _, stderr, err := check(t, "--config", path); err == nil || !strings.Contains(stderr, want) {
			t.Errorf("check-config = %v, stderr %q; want %q in it", err, stderr, want)
		}
	})

	t.Run("a half-configured cluster TLS is one problem", func(t *testing.T) {
		// Before, the files that are set were read too, for a second problem of the same
		// mistake: "cluster.tls: load /etc/member.pem and : open /etc/member.pem: no such file".
		path := write("tls-half.yaml", "data_dir: "+dir+"\nstore: {driver: postgres, dsn: \"postgres://db.invalid/agentgate?search_path=public\"}\n"+
			"cluster:\n  enabled: true\n  tls: {cert_file: "+filepath.Join(dir, "gone.pem")+"}\n")
		want := fmt.Sprintf("%s:5: cluster.tls: \"cert_file \\\"%s\\\", key_file \\\"\\\", ca_file \\\"\\\"\": set all three files (mutual TLS) or none\n",
			path, filepath.Join(dir, "gone.pem"))
		if _, stderr, err := check(t, "--config", path); err == nil || err.Error() != "config has 1 problem(s)" || stderr != want {
			t.Errorf("check-config = %v, stderr %q; want one problem, %q", err, stderr, want)
		}
	})

	cert, key, ca := mustClusterFiles(t, dir)
	cluster := func(name, cert, key, ca string) string {
		return write(name, "data_dir: "+dir+"\nstore: {driver: postgres, dsn: \"postgres://db.invalid/agentgate?search_path=public\"}\n"+
			"cluster:\n  enabled: true\n  tls: {cert_file: "+cert+", key_file: "+key+", ca_file: "+ca+"}\n")
	}
	for _, tt := range []struct {
		name, path string
		line       int    // of the key named, in the file
		want       string // stderr after FILE:LINE; "" is config ok
	}{
		{"cluster TLS files that load", cluster("tls-ok.yaml", cert, key, ca), 0, ""},
		{"a cluster certificate that is not there", cluster("tls-gone.yaml", filepath.Join(dir, "gone.pem"), key, ca), 5,
			"cluster.tls: load " + filepath.Join(dir, "gone.pem") + " and " + key + ": open " + filepath.Join(dir, "gone.pem") + ": no such file or directory; serve refuses to start with it"},
		{"a cluster CA that holds no certificate", cluster("tls-ca.yaml", cert, key, key), 5,
			"cluster.tls.ca_file: " + key + " holds no PEM certificate; serve refuses to start with it"},
		// Before, "config ok" of both (found by an audit).
		{"a data_dir that is a file", write("file-dir.yaml", "data_dir: "+cert+"\n"), 1,
			`data_dir: "` + cert + `": exists but is not a directory; serve refuses to start with it`},
		{"a CA file the DSN names that is not here", write("pg-ca.yaml", "data_dir: "+dir+"\nstore: {driver: postgres, dsn: \"postgres://db.invalid/agentgate?sslmode=verify-full&sslrootcert="+filepath.Join(dir, "gone.pem")+"\"}\n"), 2,
			"store.dsn: names a file that cannot be read here: failed to configure TLS: unable to read CA file: open " + filepath.Join(dir, "gone.pem") + ": no such file or directory; serve refuses to start with it"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want != "" {
				tt.want = fmt.Sprintf("%s:%d: %s", tt.path, tt.line, tt.want)
			}
			stdout, stderr, err := check(t, "--config", tt.path)
			if tt.want == "" {
				if err != nil || stdout != "config ok\n" {
					t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok", err, stdout, stderr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "serve would refuse to start here: 1 problem(s)") || stderr != tt.want+"\n" {
				t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, tt.want)
			}
			stdout, stderr, err = check(t, "--config-only", "--config", tt.path)
			if err != nil || stdout != "config ok\n" || stderr != "warning: "+tt.want+"\n" {
				t.Errorf("check-config --config-only = %v, stdout %q, stderr %q; want config ok and the warning", err, stdout, stderr)
			}
		})
	}

	// Refused before anything starts: before, serve began to start (on PostgreSQL, opened the
	// store) and failed where it made the database or took the directory's lock, and check-config
	// took a DSN pgx cannot parse (found by an audit).
	t.Run("serve refuses a data_dir that is a file before it starts", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"serve", "--data-dir", cert, "--http-addr", "127.0.0.1:0"}, &out, &errOut)
		if want := `data_dir: "` + cert + `": exists but is not a directory (set by --data-dir)`; err == nil || err.Error() != want {
			t.Errorf("serve = %v, want %q", err, want)
		}
	})
	t.Run("serve refuses a file the DSN names that is not here, naming it and its line", func(t *testing.T) {
		path := write("pg-ca-serve.yaml", "data_dir: "+dir+"\nstore:\n  driver: postgres\n  dsn: \"postgres://db.invalid/agentgate?sslmode=verify-full&sslrootcert="+filepath.Join(dir, "gone.pem")+"\"\n")
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"serve", "--config", path, "--http-addr", "127.0.0.1:0"}, &out, &errOut)
		if want := path + ":4: store.dsn: names a file that cannot be read here: failed to configure TLS: unable to read CA file: open " + filepath.Join(dir, "gone.pem"); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("serve = %v, want it to begin %q", err, want)
		}
	})
	t.Run("a DSN pgx cannot parse, without its password", func(t *testing.T) {
		path := write("pg-bad.yaml", "data_dir: "+dir+"\nstore:\n  driver: postgres\n  dsn: \"postgres://agentgate:s3c ret@db.invalid/agentgate\"\n")
		want := path + ":4: store.dsn: cannot be parsed: failed to parse as URL; write it as postgres://user:password@host:port/database"
		_, stderr, err := check(t, "--config", path)
		if err == nil || !strings.HasPrefix(stderr, want) || strings.Contains(stderr, "s3c") {
			t.Errorf("check-config = %v, stderr %q; want an error, and stderr to begin %q without the password", err, stderr, want)
		}
		var out, errOut bytes.Buffer
		err = run(context.Background(), []string{"serve", "--config", path, "--http-addr", "127.0.0.1:0"}, &out, &errOut)
		if err == nil || !strings.HasPrefix(err.Error(), "config: "+want) || strings.Contains(err.Error(), "s3c") {
			t.Errorf("serve = %v, want it to begin %q without the password", err, "config: "+want)
		}
	})

	// An empty variable is unset (a template that left it out); a level is taken in any case.
	good := write("good.yaml", "data_dir: "+dir+"\nlog: {level: WARN}\n")
	for _, env := range []string{"", "DEBUG", "Info"} {
		t.Run("AGENTGATE_LOG_LEVEL="+env, func(t *testing.T) {
			t.Setenv("AGENTGATE_LOG_LEVEL", env)
			t.Setenv("AGENTGATE_SESSIONS_QUEUE_CAP", "")
			if stdout, stderr, err := check(t, "--config", good); err != nil || stdout != "config ok\n" {
				t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok", err, stdout, stderr)
			}
		})
	}
}

// mustClusterFiles writes a CA's certificate and a member's certificate and key that it signed,
// as PEM files in dir.
func mustClusterFiles(t *testing.T, dir string) (cert, key, ca string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey, memberKey := newKey(), newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	memberTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	memberDER, err := x509.CreateCertificate(rand.Reader, memberTmpl, caTmpl, &memberKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(memberKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("member.pem", "CERTIFICATE", memberDER), write("member-key.pem", "PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER)
}

// TestRefusedSecretLeavesNothingOnDisk: a start refused for a secret variable that is not set
// makes no data directory, database or spool: before, the HTTP token and the Discord bot
// token were read after the store was opened, and a mistyped --data-dir was left behind with
// a database in it.
func TestRefusedSecretLeavesNothingOnDisk(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AGENTGATE_TEST_UNSET_TOKEN", "")
	t.Setenv("AGENTGATE_TEST_BLANK_TOKEN", " \n")
	t.Setenv("AGENTGATE_TEST_BOT_PREFIX", "bot")
	for _, tc := range []struct {
		name, env, wantErr string
	}{
		// As check-config reads it: white space is no token (before, serve started with it).
		{"discord token of white space", "AGENTGATE_PLATFORMS_DISCORD_TOKEN_ENV=AGENTGATE_TEST_BLANK_TOKEN", "platforms.discord.token_env: AGENTGATE_TEST_BLANK_TOKEN is not set here; serve refuses to start without the bot token"},
		{"discord token of the prefix alone", "AGENTGATE_PLATFORMS_DISCORD_TOKEN_ENV=AGENTGATE_TEST_BOT_PREFIX", `platforms.discord.token_env: AGENTGATE_TEST_BOT_PREFIX holds the prefix "Bot" alone, without the token`},
		{"http token", "AGENTGATE_HTTP_TOKEN_ENV=AGENTGATE_TEST_UNSET_TOKEN", "http.token_env: AGENTGATE_TEST_UNSET_TOKEN is not set here"},
		{"discord token", "AGENTGATE_PLATFORMS_DISCORD_TOKEN_ENV=AGENTGATE_TEST_UNSET_TOKEN", "platforms.discord.token_env: AGENTGATE_TEST_UNSET_TOKEN is not set here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, value, _ := strings.Cut(tc.env, "=")
			t.Setenv(name, value)
			t.Setenv("AGENTGATE_PLATFORMS_DISCORD_ENABLED", strconv.FormatBool(strings.HasPrefix(tc.name, "discord")))
			data := filepath.Join(dir, tc.name)
			var stdout, stderr bytes.Buffer
			// Bounded: a start that is not refused serves until ctx ends.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err := run(ctx, []string{"serve", "--data-dir", data, "--http-addr", "127.0.0.1:0"}, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("serve = %v, want an error containing %q", err, tc.wantErr)
			}
			if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the refused start left %s behind (stat: %v)\n%s", data, err, stderr.String())
			}
		})
	}
}

// TestTakenPortLeavesNothingOnDisk: serve refuses a taken HTTP port before it opens the store,
// so a mistyped --data-dir is not left behind as a fresh, empty data directory (before, the
// database, its lock files and the spool were made first).
func TestTakenPortLeavesNothingOnDisk(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	data := filepath.Join(t.TempDir(), "data")
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"serve", "--data-dir", data, "--http-addr", taken.Addr().String()}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "http.addr "+taken.Addr().String()+" is taken") {
		t.Fatalf("serve on a taken port = %v, want the port refused", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused start left %s behind (stat: %v)\n%s", data, err, stderr.String())
	}
}

// TestSecondDaemonSaysWhatToDo: a second serve on a data directory a daemon runs on is told
// which daemon holds it and what to do, on the daemon's own port (refused first: it is bound
// before the store opens) or on another. Before, the error named the daemon but not the fix.
func TestSecondDaemonSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = dir, "127.0.0.1:0"
	d, err := supervisor.Start(t.Context(), cfg, slog.New(slog.DiscardHandler), supervisor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	addr := d.Addr().String()
	for _, tc := range []struct{ name, port, want string }{
		{"on its port", addr, "start: http.addr " + addr + " is taken by the agentgate daemon of data directory " + dir +
			": stop it, or give this one another --data-dir and --http-addr: listen http: listen tcp4 " + addr + ": bind: address already in use"},
		{"on another port", "127.0.0.1:0", "persistence: store in use by another agentgate process (the daemon there answers at " + addr +
			"): stop it, or give this one another --data-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), []string{"serve", "--data-dir", dir, "--http-addr", tc.port}, &stdout, &stderr)
			if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
				t.Errorf("a second serve on the data directory = %v, want an error ending %q", err, tc.want)
			}
		})
	}
}

// TestFirstSignalSaysWhatTheDrainWaitsFor: the first stop signal's log line says what the
// drain waits for and that a second signal exits at once, in words true at a terminal (Ctrl-C)
// and under a service manager (SIGTERM). Before, it said only "draining deadline=30s".
func TestFirstSignalSaysWhatTheDrainWaitsFor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	d := MustServe(t, t.TempDir())
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	const want = "INF signal received; draining: waiting up to the deadline for the running turns and the messages queued behind them; " +
		"a second SIGINT or SIGTERM (Ctrl-C again) exits at once signal=terminated deadline=30s"
	if !strings.Contains(d.stderr.String(), want) {
		t.Errorf("the log of a stop signal:\n%s\nwant a line with %q", d.stderr.String(), want)
	}
}
