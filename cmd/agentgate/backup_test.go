package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackupOfARunningDaemon: `agentgate backup` copies the database of a daemon that is
// running and answering; a daemon started on the copy has the chat's transcript and goes on
// with it. The backup refuses to overwrite a file.
func TestBackupOfARunningDaemon(t *testing.T) {
	dataDir := t.TempDir()
	d := MustServe(t, dataDir)
	const key = "agent:main:http:dm:c1"
	for i := range 3 {
		status, res := post(t, d.base+"/v1/messages?wait=30s", "", fmt.Sprintf(`{"chat_id":"c1","user_id":"u1","text":"hello %d","message_id":"m%d"}`, i, i))
		if status != http.StatusOK {
			t.Fatalf("POST %d: %d %v", i, status, res)
		}
	}

	out := filepath.Join(t.TempDir(), "agentgate-backup.db")
	backupCmd := func() (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{"backup", "--data-dir", dataDir, out}, &stdout, &stderr)
		return stdout.String() + stderr.String(), err
	}
	if text, err := backupCmd(); err != nil || !strings.Contains(text, "backed up") {
		t.Fatalf("agentgate backup: %v\n%s", err, text)
	}
	if text, err := backupCmd(); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second backup to the same file: %v %s, want an error that says it exists", err, text)
	}

	restored := t.TempDir()
	copyFile(t, out, filepath.Join(restored, "agentgate.db"))
	r := MustServe(t, restored)
	_, transcript := get(t, r.base+"/v1/sessions/"+key+"/transcript")
	for i := range 3 {
		if !strings.Contains(transcript, fmt.Sprintf(`"hello %d"`, i)) {
			t.Errorf("the restored transcript lacks message %d:\n%s", i, transcript)
		}
	}
	if n := strings.Count(transcript, `"role":"assistant"`); n != 3 {
		t.Errorf("the restored transcript holds %d replies, want 3:\n%s", n, transcript)
	}
	status, res := post(t, r.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"after","message_id":"m9"}`)
	if status != http.StatusOK {
		t.Errorf("the chat on the restored database: %d %v, want 200", status, res)
	}
	// The same message id again is known to the restored database: not stored twice.
	if status, res := post(t, r.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"hello 0","message_id":"m0"}`); status != http.StatusAccepted || res["disposition"] != "duplicate" {
		t.Errorf("a message the backup holds, sent again: %d %v, want 202 duplicate", status, res)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBackupOfPostgreSQLSaysHowToDumpIt: backup of a PostgreSQL store is pg_dump's, and the
// command says how, with the one schema of the deployment and a DSN that pg_dump takes (libpq
// refuses a URL with search_path=, which the README's DSNs name).
func TestBackupOfPostgreSQLSaysHowToDumpIt(t *testing.T) {
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", "postgres://agentgate@127.0.0.1:1/agentgate?search_path=team_a")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"backup", "--data-dir", t.TempDir(), filepath.Join(t.TempDir(), "out.db")}, &stdout, &stderr)
	if err == nil {
		t.Fatal("backup of a PostgreSQL store: no error, want pg_dump's command")
	}
	for _, want := range []string{"pg_dump --format=custom --schema=SCHEMA", "options=-csearch_path%3DSCHEMA"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("backup of a PostgreSQL store said %q, want it to name %q", err, want)
		}
	}
}
