package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// clearPGEnv unsets, for the test, the PG* variables pgx reads, which a developer's environment
// may hold.
func clearPGEnv(t *testing.T) {
	t.Helper()
	for _, name := range pgEnv {
		t.Setenv(name, "") // (restored at the end of the test)
		os.Unsetenv(name)  // an empty PGSSLCERTMODE is a value pgx refuses
	}
}

// TestPostgresEnv: a value pgx refuses in a PG* variable it reads, for a setting store.dsn
// leaves out, is named as the variable's, not store.dsn's, and it is this machine's problem
// (CheckPostgres: check-config's refusals), not the configuration's. The same value in store.dsn
// itself stays store.dsn's. Before, a PGSSLMODE=bogus was "store.dsn: cannot be parsed: failed
// to configure TLS: sslmode is invalid", of a DSN that held no sslmode.
func TestPostgresEnv(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "ca.pem")
	const url = "postgres://agentgate:s3cret@db.internal/agentgate"
	const kv = "host=db.internal user=agentgate password=s3cret dbname=agentgate"
	tests := []struct {
		name string
		env  map[string]string
		dsn  string
		// want is CheckPostgres's problem ("" for none); wantDSN is Load's problem of store.dsn
		// after "cannot be parsed: " ("" for none).
		want, wantDSN string
	}{
		{"sslmode", map[string]string{"PGSSLMODE": "bogus"}, url,
			`PGSSLMODE: "bogus": failed to configure TLS: sslmode is invalid (pgx reads the variable for the PostgreSQL store where store.dsn leaves the setting out): correct or unset it`, ""},
		{"sslmode with key=value pairs", map[string]string{"PGSSLMODE": "bogus"}, kv,
			`PGSSLMODE: "bogus": failed to configure TLS: sslmode is invalid (`, ""},
		{"sslmode the DSN sets", map[string]string{"PGSSLMODE": "bogus"}, url + "?sslmode=sometimes", "", "failed to configure TLS: sslmode is invalid"},
		{"sslmode the DSN sets well", map[string]string{"PGSSLMODE": "bogus"}, url + "?sslmode=require", "", ""},
		{"sslmode the DSN sets as ssl=true", map[string]string{"PGSSLMODE": "bogus"}, url + "?ssl=true", "", ""},
		{"port", map[string]string{"PGPORT": "abc"}, url, `PGPORT: "abc": invalid port (`, ""},
		{"port the DSN sets", map[string]string{"PGPORT": "abc"}, "postgres://agentgate:s3cret@db.internal:5432/agentgate", "", ""},
		{"connect_timeout", map[string]string{"PGCONNECT_TIMEOUT": "soon"}, kv, `PGCONNECT_TIMEOUT: "soon": invalid connect_timeout (`, ""},
		{"target_session_attrs", map[string]string{"PGTARGETSESSIONATTRS": "any-of-them"}, url,
			`PGTARGETSESSIONATTRS: "any-of-them": unknown target_session_attrs value: any-of-them (`, ""},
		{"a CA file that is not here", map[string]string{"PGSSLROOTCERT": missing}, url,
			`PGSSLROOTCERT: "` + missing + `": failed to configure TLS: unable to read CA file: open ` + missing + `: no such file or directory (`, ""},
		{"hosts and ports that do not match", map[string]string{"PGHOST": "a,b,c", "PGPORT": "1,2"}, "dbname=agentgate password=s3cret",
			`PGHOST and PGPORT: could not match 2 port numbers to 3 hosts (`, ""},
		{"ports that do not match the DSN's hosts", map[string]string{"PGHOST": "x", "PGPORT": "1,2"}, "host=a,b,c dbname=agentgate password=s3cret",
			`PGPORT: "1,2": could not match 2 port numbers to 3 hosts (`, ""},
		{"a DSN problem before the variable's", map[string]string{"PGSSLMODE": "bogus"}, "postgres://agentgate:s3cret@db.internal:port/agentgate", "", "invalid port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearPGEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, err := Load("", []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + tt.dsn}, nil)
			switch {
			case tt.wantDSN == "" && err != nil:
				t.Fatalf("Load(dsn %q) = %v, want no problem", tt.dsn, err)
			case tt.wantDSN != "" && (err == nil || !strings.HasPrefix(err.Error(), "store.dsn: cannot be parsed: "+tt.wantDSN)):
				t.Fatalf("Load(dsn %q) = %v, want store.dsn's problem %q", tt.dsn, err, tt.wantDSN)
			case err != nil && strings.Contains(err.Error(), "s3c"):
				t.Errorf("Load(dsn %q) = %v, which shows the password", tt.dsn, err)
			}
			if cfg == nil {
				cfg = Default()
				cfg.Store.Driver, cfg.Store.DSN = "postgres", tt.dsn
			}
			got := cfg.CheckPostgres()
			switch {
			case tt.want == "" && got != nil:
				t.Errorf("CheckPostgres() of dsn %q = %v, want nil", tt.dsn, got)
			case tt.want != "" && (got == nil || !strings.HasPrefix(got.Error(), tt.want)):
				t.Errorf("CheckPostgres() of dsn %q = %v, want it to begin %q", tt.dsn, got, tt.want)
			case got != nil && (strings.Contains(got.Error(), "s3c") || strings.Contains(got.Error(), "store.dsn:")):
				t.Errorf("CheckPostgres() of dsn %q = %v, which shows the password or blames store.dsn", tt.dsn, got)
			}
		})
	}
}
