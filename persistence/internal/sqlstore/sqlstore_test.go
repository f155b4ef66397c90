package sqlstore

import (
	"errors"
	"math"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

func TestMigrations(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("B")},
		"m/0001_a.sql": {Data: []byte("A")},
		"m/0010_c.sql": {Data: []byte("C")},
		"m/README":     {Data: []byte("not a migration")},
	}
	ms, err := Migrations(fsys, "m/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+"="+m.SQL)
	}
	if want := "0001_a.sql=A 0002_b.sql=B 0010_c.sql=C"; strings.Join(got, " ") != want {
		t.Errorf("Migrations = %v, want %s", got, want)
	}
	for name, bad := range map[string]fstest.MapFS{
		"no version":        {"m/init.sql": {}},
		"zero version":      {"m/0000_x.sql": {}},
		"duplicate version": {"m/0001_a.sql": {}, "m/1_b.sql": {}},
		"none":              {},
	} {
		if _, err := Migrations(bad, "m/*.sql"); err == nil {
			t.Errorf("Migrations(%s) = nil error, want one", name)
		}
	}
}

func TestNanoBound(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Time{}, 1},
		{time.Unix(0, 0), 1},
		{time.Unix(0, 5), 5},
		{time.Unix(1_700_000_000, 7), 1_700_000_000_000_000_007},
		{time.Unix(0, math.MaxInt64).Add(time.Second), math.MaxInt64},
	} {
		if got := NanoBound(c.t); got != c.want {
			t.Errorf("NanoBound(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}

func TestPrefixed(t *testing.T) {
	if got := Prefixed("m.", "a, b,\n\t\tc"); got != "m.a, m.b, m.c" {
		t.Errorf("Prefixed = %q", got)
	}
}

func TestMarkUnavailable(t *testing.T) {
	busy := errors.New("busy")
	errs := []error{nil, busy, errors.New("constraint"), persistence.ErrUnavailable}
	MarkUnavailable(errs, func(err error) bool { return errors.Is(err, busy) || errors.Is(err, persistence.ErrUnavailable) })
	if errs[0] != nil || !errors.Is(errs[1], persistence.ErrUnavailable) || !errors.Is(errs[1], busy) ||
		errors.Is(errs[2], persistence.ErrUnavailable) || errs[3] != persistence.ErrUnavailable {
		t.Errorf("MarkUnavailable = %v", errs)
	}
	if got := Fill(make([]error, 2), busy); got[0] != busy || got[1] != busy {
		t.Errorf("Fill = %v", got)
	}
}
