package supervisor

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
)

// TestReadyzNamesADatabaseFoundCorruptWhileRunning: a database damaged while the daemon runs
// (pages overwritten behind its back) fails the reads that meet the damage, and from then on
// /readyz answers 503 naming the store corrupt and what to do, and agentgate_store_corrupt is
// 1. Before, /readyz said {"status":"ready","store":"ok"} and no metric moved while every new
// chat was answered 503 (found by a RUNBOOK walkthrough).
func TestReadyzNamesADatabaseFoundCorruptWhileRunning(t *testing.T) {
	dir := t.TempDir()
	// A database of some hundred pages, its writes checkpointed into the file by a clean stop.
	r := startOn(t, dir, 0, echo.New())
	text := strings.Repeat("word ", 400)
	for i := range 40 {
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i%4), UserID: "u"}
		r.inject(t, src, fmt.Sprint("m", i), text)
	}
	r.waitSent(t, 40)
	r.stop(t)

	r = startOn(t, dir, 0, echo.New())
	defer r.stop(t)
	base := "http://" + r.d.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the damage = %d %s, want 200", code, body)
	}
	mustOverwriteFrom(t, r.d.cfg.DSN(), 3) // as dd if=/dev/urandom … seek=2 conv=notrunc does

	// New chats load their sessions from the damaged file, on reader connections that have
	// not read its pages yet.
	refused := false
	for i := 0; i < 20 && !refused; i++ {
		resp, err := http.Post(base+"/v1/messages", "application/json",
			strings.NewReader(fmt.Sprintf(`{"chat_id":"new-%d","user_id":"u","text":"hello"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		refused = resp.StatusCode == http.StatusServiceUnavailable
	}
	if !refused {
		t.Fatal("no new chat was refused by the damaged database; the damage was not met")
	}

	code, body := get("/readyz")
	var ready struct{ Components map[string]string }
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	const prefix, fix = "ping: the database is corrupt (", "database disk image is malformed (11)): stop the daemon, then restore a backup"
	if store := ready.Components["store"]; code != http.StatusServiceUnavailable || !strings.HasPrefix(store, prefix) || !strings.Contains(store, fix) {
		t.Errorf("/readyz after the damage was met = %d %s\nwant 503 with store %q…%q…", code, body, prefix, fix)
	}
	if _, metrics := get("/metrics"); !strings.Contains(metrics, "\nagentgate_store_corrupt 1\n") {
		t.Errorf("/metrics after the damage was met lacks agentgate_store_corrupt 1")
	}
}

// mustOverwriteFrom writes random bytes over the file at path from page first (of 4096 bytes,
// numbered from 1) to its end.
func mustOverwriteFrom(t *testing.T, path string, first int64) {
	t.Helper()
	const page = 4096
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < (first+20)*page {
		t.Fatalf("%s has %d bytes, too few pages to damage", filepath.Base(path), fi.Size())
	}
	junk := make([]byte, fi.Size()-(first-1)*page)
	_, _ = rand.NewChaCha8([32]byte{42}).Read(junk)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(junk, (first-1)*page); err != nil {
		t.Fatal(err)
	}
}
