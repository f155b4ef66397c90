package config

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dsnForms says how a PostgreSQL DSN is written, as the store's Open says it.
const dsnForms = "write it as postgres://user:password@host:port/database?sslmode=... or as key=value pairs (host=... port=... dbname=... user=...)"

// pgProblem is why pgx cannot read the PostgreSQL store's settings.
type pgProblem struct {
	// reason is pgx's words, "" when it can read them.
	reason string
	// file reports that the cause is a file the settings name (sslrootcert, sslcert, sslkey, a
	// service file), which may exist where the configuration runs but not here.
	file bool
	// vars are the PG* environment variables the problem is of: pgx reads them (as libpq does)
	// for the settings store.dsn leaves out. Empty when the problem is store.dsn's own.
	vars []string
}

// pgDSNProblem says why pgx, which the PostgreSQL store opens dsn with, cannot read it. The
// words are pgx's own, without the DSN and without the cause they wrap, which may quote it (a
// mislaid password among them); pgx redacts a password only as far as it can parse the DSN.
func pgDSNProblem(dsn string) pgProblem {
	if dsn == "" {
		return pgProblem{} // (required, which is said apart)
	}
	_, err := pgxpool.ParseConfig(dsn)
	if err == nil {
		return pgProblem{}
	}
	const unsaid = "pgx cannot read it" // (for words of pgx's that may quote the DSN)
	msg, cause, ok := pgReason(err)
	if !ok {
		return pgProblem{reason: unsaid}
	}
	p := pgProblem{file: errors.As(cause, new(*fs.PathError)) || msg == "failed to read service"}
	if cause != nil && (msg == "failed to configure TLS" || p.file) {
		// Its causes name a TLS mode or a file, never what the DSN holds otherwise.
		msg += ": " + cause.Error()
	}
	p.reason = msg
	p.vars = pgEnvBlamed(dsn, msg)
	return p
}

// pgReason returns the words of err, a pgx error of parsing a DSN, without the DSN and without
// the cause they wrap (returned apart); ok is false when err is not such an error.
func pgReason(err error) (msg string, cause error, ok bool) {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "", nil, false
	}
	bare := *pe
	bare.ConnString = ""
	msg, ok = strings.CutPrefix(bare.Error(), "cannot parse ``: ")
	cause = errors.Unwrap(pe)
	if ok && cause != nil {
		msg, ok = strings.CutSuffix(msg, " ("+cause.Error()+")")
	}
	return msg, cause, ok
}

// pgEnv maps the settings that pgx reads from a PG* environment variable when the DSN leaves
// them out (pgconn's parseEnvSettings) to that variable, for the settings whose value pgx can
// refuse.
var pgEnv = map[string]string{
	"host":                 "PGHOST",
	"port":                 "PGPORT",
	"connect_timeout":      "PGCONNECT_TIMEOUT",
	"sslmode":              "PGSSLMODE",
	"sslrootcert":          "PGSSLROOTCERT",
	"sslcert":              "PGSSLCERT",
	"sslkey":               "PGSSLKEY",
	"sslcertmode":          "PGSSLCERTMODE",
	"sslpassword":          "PGSSLPASSWORD",
	"service":              "PGSERVICE",
	"servicefile":          "PGSERVICEFILE",
	"target_session_attrs": "PGTARGETSESSIONATTRS",
	"min_protocol_version": "PGMINPROTOCOLVERSION",
	"max_protocol_version": "PGMAXPROTOCOLVERSION",
	"channel_binding":      "PGCHANNELBINDING",
	"require_auth":         "PGREQUIREAUTH",
}

// pgReasonSettings maps the beginning of pgx's words for a value it refuses to the settings
// that value may come from; the first match is taken, so a narrower beginning comes first.
var pgReasonSettings = []struct {
	prefix   string
	settings []string
}{
	{"invalid port", []string{"port"}},
	{"could not match", []string{"host", "port"}},
	{"invalid connect_timeout", []string{"connect_timeout"}},
	{"invalid sslcertmode", []string{"sslcertmode"}},
	{"failed to configure TLS: sslmode is invalid", []string{"sslmode"}},
	{"failed to configure TLS: unable to read CA file", []string{"sslrootcert"}},
	{"failed to configure TLS: unable to add CA", []string{"sslrootcert"}},
	{"failed to configure TLS: unable to load system certificate pool", []string{"sslrootcert"}},
	{`failed to configure TLS: both "sslcert" and "sslkey"`, []string{"sslcert", "sslkey"}},
	{"failed to configure TLS: unable to read sslkey", []string{"sslkey"}},
	{"failed to configure TLS: failed to decode sslkey", []string{"sslkey"}},
	{"failed to configure TLS: unable to read cert", []string{"sslcert"}},
	{"failed to configure TLS: unable to load cert", []string{"sslcert", "sslkey"}},
	{"failed to configure TLS: unable to decrypt key", []string{"sslpassword"}},
	{"failed to read service", []string{"service", "servicefile"}},
	{"unknown target_session_attrs", []string{"target_session_attrs"}},
	{"invalid min_protocol_version", []string{"min_protocol_version"}},
	{"invalid max_protocol_version", []string{"max_protocol_version"}},
	{"min_protocol_version cannot be greater", []string{"min_protocol_version", "max_protocol_version"}},
	{"unknown channel_binding", []string{"channel_binding"}},
	{"invalid require_auth", []string{"require_auth"}},
}

// pgEnvBlamed returns the PG* variables that the problem reason (pgx's words) is of: set in
// this process's environment, which pgx reads, for a setting the reason names and dsn leaves
// out. None when dsn writes the setting itself, or the reason names no setting a variable sets.
// Before, a PGSSLMODE=bogus was blamed on store.dsn, which may hold no sslmode at all.
func pgEnvBlamed(dsn, reason string) []string {
	var settings []string
	for _, r := range pgReasonSettings {
		if strings.HasPrefix(reason, r.prefix) {
			settings = r.settings
			break
		}
	}
	var set []string
	for _, s := range settings {
		v, ok := os.LookupEnv(pgEnv[s])
		if v != "" || ok && s == "sslcertmode" { // as pgx reads them: an empty PGSSLCERTMODE is refused
			set = append(set, s)
		}
	}
	if len(set) == 0 {
		return nil
	}
	written := dsnSettings(dsn)
	var vars []string
	for _, s := range set {
		if !written[s] {
			vars = append(vars, pgEnv[s])
		}
	}
	return vars
}

var notAllowedRE = regexp.MustCompile(`^connection string key ("(?:[^"\\]|\\.)*") is not in ConnStringAllowedKeys$`)

// dsnSettings returns the settings dsn writes, in pgx's names (dbname is database; a URL's ssl
// is sslmode), as pgx's own parser reads it: allowed none, it refuses the first key it finds,
// then, allowed that one, the next, and so on (before it reads any file or variable).
func dsnSettings(dsn string) map[string]bool {
	written := make(map[string]bool)
	allowed := []string{}
	for range 256 { // (a bound on a DSN of absurd length)
		_, err := pgconn.ParseConfigWithOptions(dsn, pgconn.ParseConfigOptions{ConnStringAllowedKeys: allowed})
		msg, _, _ := pgReason(err)
		m := notAllowedRE.FindStringSubmatch(msg)
		if m == nil {
			break
		}
		key, err := strconv.Unquote(m[1])
		if err != nil || written[key] {
			break
		}
		written[key] = true
		allowed = append(allowed, key)
	}
	if written["ssl"] {
		written["sslmode"] = true
	}
	return written
}

// CheckPostgres returns what pgx, with which the PostgreSQL store opens, refuses on this
// machine: a file store.dsn names (sslrootcert, sslcert, sslkey, a service file) that cannot be
// read here, or a PG* environment variable it reads for a setting store.dsn leaves out
// (PGSSLMODE, PGPORT…) that holds a value it refuses. Validate leaves both out because they are
// this machine's rather than the configuration's: the files may be where the configuration
// runs rather than where it is checked. serve refuses to start with either, and the sessions
// commands to open the store.
func (c *Config) CheckPostgres() error {
	if c.Store.Driver != "postgres" || c.Store.DSN == "" {
		return nil
	}
	p := pgDSNProblem(c.Store.DSN)
	switch {
	case len(p.vars) > 0:
		fe := &FieldError{Field: strings.Join(p.vars, " and "), Err: errors.New(p.reason +
			" (pgx reads the variable for the PostgreSQL store where store.dsn leaves the setting out): correct or unset it")}
		if len(p.vars) == 1 && !strings.Contains(p.vars[0], "PASSWORD") {
			fe.Value = os.Getenv(p.vars[0])
		}
		return fe
	case p.file:
		return &FieldError{Field: "store.dsn", Err: errors.New("names a file that cannot be read here: " + p.reason)}
	}
	return nil
}

// PostgresAdvice returns what README advises against in the PostgreSQL store's settings, which
// serve starts with all the same: a store.dsn that holds the password (it belongs in
// PGPASSWORD or a passfile, out of a file that is copied, versioned and read by more people
// than the database's owner), and a connection that names no search_path (PostgreSQL's
// default, "$user", public, puts the tables into another schema, as on an empty database, once
// a schema named after the user is created). Each is a *FieldError of store.dsn, which never
// quotes the DSN.
func (c *Config) PostgresAdvice() []error {
	if c.Store.Driver != "postgres" || c.Store.DSN == "" {
		return nil
	}
	var out []error
	if dsnSettings(c.Store.DSN)["password"] {
		out = append(out, &FieldError{Field: "store.dsn", Err: errors.New("holds the database password: " +
			"keep it out of the configuration, in PGPASSWORD or a passfile (~/.pgpass)")})
	}
	// As pgx reads it, PGOPTIONS included; a DSN it cannot read is a problem said apart.
	if pc, err := pgconn.ParseConfig(c.Store.DSN); err == nil &&
		pc.RuntimeParams["search_path"] == "" && !strings.Contains(pc.RuntimeParams["options"], "search_path") {
		out = append(out, &FieldError{Field: "store.dsn", Err: errors.New("names no search_path: the tables go into the first schema of " +
			`PostgreSQL's default, "$user", public, which changes once a schema named after the user exists: ` +
			"name the schema (search_path=public for the default)")})
	}
	return out
}
