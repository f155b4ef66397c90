package main

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/jackc/pgx/v5"
)

// TestDaemonOnPostgres runs the binary on PostgreSQL as an operator would configure it (the
// environment): an acknowledged message is in the database, survives kill -9 and is answered
// by the next daemon; a second daemon on the same database is refused while one runs; the
// sessions command reads it.
func TestDaemonOnPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pg := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn}
	d := MustServe(t, t.TempDir(), append(pg, "AGENTGATE_AGENT_BACKEND=exec", `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, "sleep 60"]`)...)
	status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"survive me","message_id":"m1"}`)
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ack)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var text, state string
	err = conn.QueryRow(context.Background(), `SELECT content, status FROM messages
		WHERE message_id = 'm1' AND role = 'user'`).Scan(&text, &state)
	if err != nil || text != "survive me" || state != "pending" {
		t.Fatalf("the acknowledged message in PostgreSQL: %q %q %v, want it stored and pending", text, state, err)
	}

	second := exec.Command(MustBuild(t), "serve", "--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0")
	second.Env = append(os.Environ(), pg...)
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(string(out), "another agentgate daemon uses this database") ||
		!strings.Contains(string(out), "stop it, or give this one another database or schema (store.dsn, its search_path)") {
		t.Errorf("a second daemon on the database: %v\n%s\nwant it refused", err, out)
	}

	d.kill(t)                              // kill -9 with the turn running
	d2 := MustServe(t, t.TempDir(), pg...) // echo agent; nothing of the first daemon's data dir
	key := ack["session_key"].(string)
	events := readSSE(t, d2.base+"/v1/sessions/"+key+"/events", "", 1)
	if events[0].data["text"] != "survive me" {
		t.Errorf("after kill -9 the session said %v, want the echo of the acknowledged message", events[0].data)
	}
	if err := d2.stop(t, 30*time.Second); err != nil {
		t.Errorf("second daemon exit: %v", err)
	}
	list := exec.Command(MustBuild(t), "sessions", "list", "--data-dir", t.TempDir())
	list.Env = append(os.Environ(), pg...)
	if out, err := list.CombinedOutput(); err != nil || !strings.Contains(string(out), key) {
		t.Errorf("agentgate sessions list on PostgreSQL: %v\n%s\nwant the session %s", err, out, key)
	}
	var users, replies int
	err = conn.QueryRow(context.Background(), `SELECT
		COUNT(*) FILTER (WHERE role = 'user' AND status = 'done'),
		COUNT(*) FILTER (WHERE role = 'assistant' AND content = 'survive me')
		FROM messages`).Scan(&users, &replies)
	if err != nil || users != 1 || replies != 1 {
		t.Errorf("rows after the restart: %d answered user messages, %d replies (%v); want 1 and 1", users, replies, err)
	}
}

// TestSessionsResetInACluster: cluster members hold no lock on the database, so `sessions
// reset` claims the key as a session activation does: the member running the session is
// fenced out at its next write, and the reset is what the next activation loads.
func TestSessionsResetInACluster(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const key = "agent:main:http:dm:c1"
	at := time.Now()
	s := persistence.Session{ID: "s1", Key: key, Platform: "http", ChatType: "dm", ChatID: "c1", StartedAt: at, LastActivityAt: at}
	claimed, err := st.Claim(ctx, key, "member-1", at, nil) // a member runs the session
	if err != nil {
		t.Fatal(err)
	}
	memberEpoch := claimed.Epoch
	if errs := st.Commit(ctx, [][]persistence.Op{{&persistence.Fence{Key: key, Epoch: memberEpoch},
		&persistence.CreateSession{Session: s},
		// Something was said in it: a reset leaves a session nothing was said in as it is.
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: 1, Role: persistence.RoleUser,
			Content: "hi", Platform: "http", ChatID: "c1", MessageID: "m1", UserID: "u1", Status: persistence.StatusDone, Active: true, CreatedAt: at}},
		&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: at}}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}

	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	out, _ := MustRunSessions(t, "reset", key, "--data-dir", t.TempDir())
	if !strings.Contains(out, "ended session s1") {
		t.Errorf("sessions reset said %q", out)
	}
	got, err := st.Session(ctx, "s1")
	if err != nil || got.EndReason != persistence.EndResetCommand {
		t.Errorf("session after the reset: %+v, %v; want it ended by reset_command", got, err)
	}
	own, err := st.Ownership(ctx, key)
	if err != nil || own.Epoch != memberEpoch+1 {
		t.Errorf("ownership after the reset: %+v, %v; want the key claimed by the reset", own, err)
	}
	errs := st.Commit(ctx, [][]persistence.Op{{&persistence.Fence{Key: key, Epoch: memberEpoch},
		&persistence.SetTitle{SessionID: "s1", Title: "the member writes on"}}})
	if !errors.Is(errs[0], persistence.ErrFenced) {
		t.Errorf("the member's next write: %v, want ErrFenced", errs[0])
	}
}

// TestDaemonRefusesADataDirInUseOnPostgres: two single daemons on PostgreSQL (two deployments:
// their own databases) given one data directory are refused, as two on SQLite are. The data
// directory holds each daemon's spool: two daemons numbering batches in one spool directory
// overwrite each other's acknowledged writes, and each replays the other's into its own
// database at its next start. A SQLite daemon whose store.dsn lies outside the data directory
// took no lock on the data directory either.
func TestDaemonRefusesADataDirInUseOnPostgres(t *testing.T) {
	other := t.TempDir()
	for _, tc := range []struct {
		name          string
		first, second []string
	}{
		{"postgres", pgEnv(pgtest.NewDatabase(t)), pgEnv(pgtest.NewDatabase(t))},
		{"sqlite elsewhere", []string{"AGENTGATE_STORE_DSN=" + other + "/a.db"}, []string{"AGENTGATE_STORE_DSN=" + other + "/b.db"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			d := MustServe(t, dataDir, tc.first...)
			second := exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0")
			second.Env = append(os.Environ(), tc.second...)
			stdout, err := second.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			second.Stderr = &stderr
			if err := second.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
			// Its stdout ends when it exits; a "listening on" line before that means it started.
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "listening on ") {
					t.Fatalf("a second daemon on the data directory started (%s); want it refused", sc.Text())
				}
			}
			err = second.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !strings.Contains(stderr.String(), "data directory in use by another process") {
				t.Errorf("second daemon: %v\n%s\nwant it refused, the data directory in use", err, stderr.String())
			}
			if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"still here"}`); status != http.StatusAccepted {
				t.Errorf("first daemon after the refused start: %d %v", status, ack)
			}
			if err := d.stop(t, 30*time.Second); err != nil {
				t.Errorf("first daemon exit: %v", err)
			}
		})
	}
}

// pgEnv is the environment that puts a daemon on the PostgreSQL database dsn.
func pgEnv(dsn string) []string {
	return []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn}
}

// TestAdminOnPostgresMakesNoDataDirectory: the writing admin commands of a single daemon on
// PostgreSQL, run where its data directory is not (another host than the daemon's: the
// database is shared), act on the database and make no data directory there. Before, they
// made one (./data by default) to take its lock, which no daemon there could hold.
func TestAdminOnPostgresMakesNoDataDirectory(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{}) // the schema, as a daemon makes it
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	dir := filepath.Join(t.TempDir(), "data")
	if out, _ := MustRunSessions(t, "pardon", "--all", "--data-dir", dir); !strings.HasPrefix(out, "pardoned 0 message(s)") {
		t.Errorf("pardon --all printed %q, want it pardoned", out)
	}
	if _, _, err := runSessions(t, "reset", "agent:main:http:dm:nobody", "--data-dir", dir); err != nil &&
		strings.Contains(err.Error(), "data directory") {
		t.Errorf("reset: %v, want no word of the data directory", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data directory %s after the commands: %v, want none made", dir, err)
	}
}
