package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// CheckSQLite returns what serve refuses on this machine of the SQLite store's path: a
// store.dsn whose directory does not exist outside data_dir. serve makes data_dir, and the store
// a directory in it (data_dir/db/agentgate.db on a new volume), but not a directory elsewhere
// that store.dsn names: before, a mistyped one made a
// new, empty database there, and the daemon ran on it as if the conversations were gone (found
// by a new user's walkthrough). The sqlite store takes store.dsn as the file's path, never as
// a URI: file:/srv/x.db is a directory named "file:" in the working directory, which this says.
func (c *Config) CheckSQLite() error {
	if c.Store.Driver != "sqlite" || c.Store.DSN == "" || postgresDSN(c.Store.DSN) {
		return nil // (the default database, in data_dir; a PostgreSQL DSN is a validation problem)
	}
	dir, err := filepath.Abs(filepath.Dir(c.Store.DSN))
	if err != nil {
		return nil // (the store's Open says so)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return nil // there, or a problem the store's Open names as it meets it
	}
	if dataDir, err := filepath.Abs(c.DataDir); err == nil && c.DataDir != "" &&
		(dir == dataDir || strings.HasPrefix(dir, dataDir+string(filepath.Separator))) {
		return nil // serve makes data_dir before it opens the store, and the store a directory in it
	}
	reason := fmt.Sprintf("its directory %s does not exist: create it, or fix the path (serve makes data_dir and directories in it, not one elsewhere that store.dsn names)", dir)
	if strings.HasPrefix(c.Store.DSN, "file:") {
		reason += `; for SQLite, store.dsn is the database file's path, not a file: URI`
	}
	// Of data_dir too, which store.dsn lies outside: a variable that set it is named (Check).
	return &FieldError{Field: "store.dsn", Value: c.Store.DSN, Err: errors.New(reason), others: []string{"data_dir"}}
}

// NewSQLiteDatabase returns, when the store is SQLite and there is no database at its path
// yet, a *FieldError of the key that puts the database there (store.dsn, else data_dir) that
// says serve will create a new, empty one: right on a first start, and the sign of a mistyped
// path where the conversations were expected. nil otherwise, and for a path CheckSQLite
// refuses.
func (c *Config) NewSQLiteDatabase() error {
	if c.Store.Driver != "sqlite" || postgresDSN(c.Store.DSN) || c.CheckSQLite() != nil {
		return nil
	}
	path, err := filepath.Abs(c.DSN())
	if err != nil {
		return nil
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	field := "store.dsn"
	if c.Store.DSN == "" {
		field = "data_dir"
	}
	return &FieldError{Field: field, Err: fmt.Errorf("there is no database at %s yet: serve will create a new, empty one there "+
		"(right on a first start; if the conversations should be there, the path is wrong)", path)}
}
