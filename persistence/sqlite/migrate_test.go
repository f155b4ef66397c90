package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// mustSchemaAt creates a database at path with the embedded migrations up to version applied,
// as a build of that schema left it, and returns a raw connection to it.
func mustSchemaAt(t *testing.T, path string, version int) *sql.DB {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	raw := MustRawDB(t, path)
	mustExec(t, raw, `CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, applied_at INTEGER NOT NULL)`)
	for _, m := range ms {
		if m.Version > version {
			break
		}
		mustExec(t, raw, m.SQL)
		mustExec(t, raw, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, m.Version)
	}
	return raw
}

// TestMigrationFromTheFirstSchema upgrades a database that a build of schema 0001 (the first
// daemon) left behind when it was killed mid-turn: a reset key of a group session per user
// whose new session has a message running and one queued behind it, replies delivered, failed
// and pending, and a shared thread. Everything it holds reads back through the store, in
// order, and each pending message keeps the sender its session's key names: 0001 stored no
// sender per message, and before 0016 such a message ran after the upgrade with an empty user
// id.
func TestMigrationFromTheFirstSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agentgate.db")
	raw := mustSchemaAt(t, path, 1)
	at := func(s int) int64 { return t0.Add(time.Duration(s) * time.Second).UnixNano() }
	// The rows as 0001's Commit wrote them (its column lists).
	for _, s := range []struct {
		id, key, chatType, chatID, threadID, userID, userName, title, prev, endReason string
		ended                                                                         any
	}{
		{"s1", "k1", "group", "c1", "", "u1", "Ann", "Trip", "", "reset_command", at(3)}, // per user
		{"s2", "k1", "group", "c1", "", "u1", "Ann", "", "s1", "", nil},
		{"s3", "k3", "thread", "c3", "th", "", "", "", "", "", nil}, // shared: no user of its own
	} {
		mustExec(t, raw, `INSERT INTO sessions (id, key, platform, chat_type, chat_id, thread_id, user_id, user_name,
			scope_id, profile, started_at, last_activity_at, ended_at, end_reason, prev_session_id, title, epoch)
			VALUES (?, ?, 'http', ?, ?, ?, ?, ?, '', '', ?, ?, ?, ?, ?, ?, 0)`,
			s.id, s.key, s.chatType, s.chatID, s.threadID, s.userID, s.userName, at(0), at(4), s.ended, s.endReason, s.prev, s.title)
	}
	msgs := []struct {
		sid                     string
		seq                     int64
		role, text, mid, status string
	}{
		{"s1", 1, "user", "hello", "m1", "done"},
		{"s1", 2, "assistant", "hi", "", "done"},
		{"s2", 1, "user", "after the reset", "m2", "done"},
		{"s2", 2, "assistant", "fresh start", "", "done"},
		{"s2", 3, "user", "running when killed", "m3", "pending"},
		{"s2", 4, "user", "queued behind it", "m4", "pending"},
		{"s3", 1, "user", "in the thread", "m5", "pending"},
	}
	for i, m := range msgs {
		mustExec(t, raw, `INSERT INTO messages (session_id, seq, role, content, platform, chat_id, message_id, turn_id,
			status, active, archived, attempts, created_at) VALUES (?, ?, ?, ?, 'http', 'c', ?, '', ?, 1, 0, 0, ?)`,
			m.sid, m.seq, m.role, m.text, m.mid, m.status, at(i))
		mustExec(t, raw, `INSERT INTO messages_fts (rowid, content) VALUES (last_insert_rowid(), ?)`, m.text)
	}
	mustExec(t, raw, `INSERT INTO routing (key, session_id, generation, updated_at) VALUES ('k1', 's2', 2, ?), ('k3', 's3', 1, ?)`, at(3), at(5))
	for seq, state := range []string{"delivered", "failed", "pending"} {
		mustExec(t, raw, `INSERT INTO outbox (session_key, seq, session_id, kind, text, in_reply_to, platform, chat_type,
			chat_id, user_id, state, created_at) VALUES ('k1', ?, ?, 'reply', ?, '[]', 'http', 'group', 'c1', 'u1', ?, ?)`,
			seq+1, []string{"s1", "s2", "s2"}[seq], state, state, at(seq))
	}

	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open of a 0001 database: %v", err)
	}
	defer s.Close()

	snap, err := s.LoadSession(ctx, "k1", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Session == nil || snap.Session.ID != "s2" || snap.Session.PrevSessionID != "s1" || !snap.Session.EndedAt.IsZero() {
		t.Fatalf("k1 loads session %+v, want s2, open, after s1", snap.Session)
	}
	var pending []string
	for _, m := range snap.Pending {
		pending = append(pending, m.MessageID+" from "+m.UserID+" "+m.UserName)
	}
	if want := []string{"m3 from u1 Ann", "m4 from u1 Ann"}; !slices.Equal(pending, want) {
		t.Errorf("k1 pending = %q, want %q (the session's user sent them)", pending, want)
	}
	var unconfirmed []int64
	for _, e := range snap.Unconfirmed {
		unconfirmed = append(unconfirmed, e.Seq)
	}
	if !slices.Equal(unconfirmed, []int64{2, 3}) || snap.LastOutboxSeq != 3 || snap.LastSeq != 4 {
		t.Errorf("k1: unconfirmed outbox %v (last %d), last seq %d; want [2 3] (3) and 4", unconfirmed, snap.LastOutboxSeq, snap.LastSeq)
	}
	for sid, want := range map[string][]string{
		"s1": {"hello", "hi"},
		"s2": {"after the reset", "fresh start", "running when killed", "queued behind it"},
	} {
		tr, err := s.Transcript(ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, m := range tr {
			if m.Seq != int64(i+1) {
				t.Errorf("transcript of %s: message %d has seq %d", sid, i, m.Seq)
			}
			got = append(got, m.Content)
		}
		if !slices.Equal(got, want) {
			t.Errorf("transcript of %s = %q, want %q", sid, got, want)
		}
	}
	old, err := s.Session(ctx, "s1")
	if err != nil || old.EndReason != "reset_command" || old.EndedAt.IsZero() || old.Title != "Trip" {
		t.Errorf("Session(s1) = %+v, %v; want it ended by reset_command, titled Trip", old, err)
	}
	shared, err := s.LoadSession(ctx, "k3", 10, 0)
	if err != nil || len(shared.Pending) != 1 || shared.Pending[0].UserID != "" {
		t.Errorf("k3 pending = %+v, %v; want m5 with no sender (a shared session's is unknown)", shared.Pending, err)
	}
	if found, err := s.Search(ctx, "killed", 10); err != nil || len(found) != 1 || found[0].MessageID != "m3" {
		t.Errorf("Search(killed) = %+v, %v; want m3", found, err)
	}
}

// TestOpenReadOnlyOlderSchema: the admin commands of a newer binary, run on a database an
// older one wrote (maybe while it still runs), neither migrate it nor read it, and say how to
// migrate it.
func TestOpenReadOnlyOlderSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	raw := mustSchemaAt(t, path, 7)
	s, err := OpenReadOnly(context.Background(), path)
	if err == nil {
		s.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "database schema version 7, want "+latestMigration(t)) ||
		!strings.Contains(err.Error(), "start this version's daemon on it once to migrate it") {
		t.Errorf("OpenReadOnly of schema 7 = %v, want an error naming both versions and how to migrate", err)
	}
	var v int
	if err := raw.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil || v != 7 {
		t.Errorf("schema version after OpenReadOnly = %d, %v, want 7", v, err)
	}
}

// TestOpenNoMigrate: a store opened to write without migrating (an admin command's, such as
// agentgate sessions reset without a daemon) takes a database of this binary's schema, and
// refuses one of an older schema, which it leaves as it is (an upgrade is one way: only the
// daemon makes it, and logs it), or of a newer one.
func TestOpenNoMigrate(t *testing.T) {
	ctx := context.Background()
	t.Run("older schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		raw := mustSchemaAt(t, path, 7)
		s, err := Open(ctx, path, Options{NoMigrate: true})
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "database schema version 7, want "+latestMigration(t)) ||
			!strings.Contains(err.Error(), "start this version's daemon on it once to migrate it") {
			t.Errorf("Open(NoMigrate) of schema 7 = %v, want an error naming both versions and how to migrate", err)
		}
		var v int
		if err := raw.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil || v != 7 {
			t.Errorf("schema version after Open(NoMigrate) = %d, %v, want 7", v, err)
		}
	})
	t.Run("newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		s, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		mustExec(t, MustRawDB(t, path), `INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)`)
		s, err = Open(ctx, path, Options{NoMigrate: true})
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "database schema version 9999 is newer than this binary's "+latestMigration(t)) {
			t.Errorf("Open(NoMigrate) of schema 9999 = %v, want it refused as newer", err)
		}
	})
	t.Run("this schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		s, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(ctx, path, Options{NoMigrate: true})
		if err != nil {
			t.Fatalf("Open(NoMigrate) of this binary's schema = %v, want it open", err)
		}
		defer s.Close()
		if err := s.Ping(ctx); err != nil {
			t.Errorf("Ping = %v, want the store writable", err)
		}
	})
}

// TestMigrationLeavesADMsSenderUnknown: the first schema's HTTP API keyed a DM by its chat id
// alone and took any user_id in it, and ran each turn with its message's own sender. Such a DM
// whose row names u1 (its first sender) also held a message from u2, answered to u2 (the
// outbox kept the reply's user), and one pending when the daemon was killed: nothing stored
// says who sent that one, so migration 0016 must not name u1 as its sender (a turn would run
// u2's text with u1's identity); it stays unknown. A group session per user is keyed by its
// user, so its messages are that user's.
func TestMigrationLeavesADMsSenderUnknown(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agentgate.db")
	raw := mustSchemaAt(t, path, 1)
	at := func(s int) int64 { return t0.Add(time.Duration(s) * time.Second).UnixNano() }
	for _, s := range []struct{ id, key, chatType, userID, userName string }{
		{"s1", "agent:main:http:dm:room", "dm", "u1", "Ann"},
		{"s2", "agent:main:http:group:g:u3", "group", "u3", "Cy"},
	} {
		mustExec(t, raw, `INSERT INTO sessions (id, key, platform, chat_type, chat_id, thread_id, user_id, user_name,
			scope_id, profile, started_at, last_activity_at, ended_at, end_reason, prev_session_id, title, epoch)
			VALUES (?, ?, 'http', ?, 'c', '', ?, ?, '', '', ?, ?, NULL, '', '', '', 0)`,
			s.id, s.key, s.chatType, s.userID, s.userName, at(0), at(4))
	}
	for i, m := range []struct{ sid, role, text, mid, status string }{
		{"s1", "user", "from ann", "m1", "done"},
		{"s1", "assistant", "hi ann", "", "done"},
		{"s1", "user", "from bo", "m2", "done"},
		{"s1", "assistant", "hi bo", "", "done"},
		{"s1", "user", "pending, sender unknown", "m3", "pending"},
		{"s2", "user", "from cy", "m4", "pending"},
	} {
		mustExec(t, raw, `INSERT INTO messages (session_id, seq, role, content, platform, chat_id, message_id, turn_id,
			status, active, archived, attempts, created_at) VALUES (?, ?, ?, ?, 'http', 'c', ?, '', ?, 1, 0, 0, ?)`,
			m.sid, i+1, m.role, m.text, m.mid, m.status, at(i))
	}
	mustExec(t, raw, `INSERT INTO routing (key, session_id, generation, updated_at) VALUES
		('agent:main:http:dm:room', 's1', 1, ?), ('agent:main:http:group:g:u3', 's2', 1, ?)`, at(0), at(0))
	for i, u := range []string{"u1", "u2"} {
		mustExec(t, raw, `INSERT INTO outbox (session_key, seq, session_id, kind, text, in_reply_to, platform, chat_type,
			chat_id, user_id, state, created_at) VALUES ('agent:main:http:dm:room', ?, 's1', 'reply', 'hi', ?, 'http', 'dm', 'c', ?, 'delivered', ?)`,
			i+1, `["m`+string(rune('1'+i))+`"]`, u, at(i))
	}

	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open of a 0001 database: %v", err)
	}
	defer s.Close()
	dm, err := s.LoadSession(ctx, "agent:main:http:dm:room", 10, 0)
	if err != nil || len(dm.Pending) != 1 {
		t.Fatalf("DM pending = %+v, %v; want m3", dm.Pending, err)
	}
	if got := dm.Pending[0].UserID; got != "" {
		t.Errorf("DM's pending m3 has sender %q, want \"\" (the DM had two senders; who sent m3 is unknown)", got)
	}
	tr, err := s.Transcript(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tr {
		if m.MessageID == "m2" && m.UserID == "u1" {
			t.Errorf("DM's m2 (answered to u2) has sender u1")
		}
	}
	group, err := s.LoadSession(ctx, "agent:main:http:group:g:u3", 10, 0)
	if err != nil || len(group.Pending) != 1 || group.Pending[0].UserID != "u3" || group.Pending[0].UserName != "Cy" {
		t.Errorf("group pending = %+v, %v; want m4 from u3 Cy (the key names its user)", group.Pending, err)
	}
}
