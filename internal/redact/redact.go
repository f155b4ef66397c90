// Package redact takes what looks like a credential out of text that agentgate logs, or puts in
// an error, but did not write itself: the output of a failed exec command, the error a model
// endpoint answered. Both agents use this one set of rules, so that what the README lists as
// redacted holds for each of them.
//
// Every rule keys on what names a secret (Bearer, an Authorization header's Basic scheme, a name
// such as api_key= or "password":, a URL's user information) or on a key's documented prefix
// (sk-, ghp_, xoxb-). None matches a bare run of token characters: a command's stderr is full of
// git commit ids (40 hex digits), SHA-256 sums, base64 blobs and long identifiers, which the
// operator reading the log may need. A caller whose text is more likely to hold an opaque token
// than such data adds a rule of its own (the openai agent does).
//
// The package is pure (no I/O, no goroutines; safe for concurrent use) and imports nothing from
// agentgate.
package redact

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
)

// Placeholder is what String puts in place of a secret.
const Placeholder = "[redacted]"

// keyLike matches a bearer token, the credentials of an Authorization or Proxy-Authorization
// header's Basic scheme (a base64 "user:password"), the value after a name such as api_key= or
// "password":, and an API key by its prefix (OpenAI's sk-, GitHub's ghp_…, Slack's xox…-). The
// first two groups keep what names the secret. A space before the value may be blanks, not a
// line break: "Password:" at the end of a prompt does not make the next line a secret. A token
// or credentials never start with "[", which keeps "Bearer [redacted]" (a value String replaced
// first) from becoming "Bearer [redacted]]".
var keyLike = regexp.MustCompile(`(?i)(bearer[ \t]+|\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["'\[]?basic[ \t]+)[^\s"',;\[\]][^\s"',;\]]*` +
	`|((?:api[_-]?key|token|secret|passw(?:or)?d)["']?[ \t]*[:=][ \t]*["']?)[^\s"',;]+` +
	`|\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abprs]-[A-Za-z0-9\-]{10,}`)

// urlPassword matches the password of a URL's user information (postgres://agent:s3cret@db,
// https://u:p@host); the first group keeps the scheme and the user, the second the @ before
// the host. The password runs to the last @ of the URL's word (up to white space, a quote or
// <>), not to the first / ? or # as net/url reads it: a password is often written into a DSN
// unescaped, and one from openssl rand -base64 holds a / (postgres://agent:ab/cd+ef==@db was
// logged whole). The price is a port before an @ in a path or a query: http://host:8080/x?to=a@b
// loses "8080/x?to=a" too. A URL without a password (http://host:8080/path, https://user@host,
// http://[::1]:80) does not match.
var urlPassword = regexp.MustCompile(`(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/?#@"'<>]*:)[^\s"'<>]*(@)`)

// String returns s with every non-empty one of values, the passwords of URLs and key-like
// strings replaced by Placeholder. The values are the caller's own secrets, replaced wherever
// they occur, longest first (so that one which holds another leaves none of itself behind); the
// caller decides which are too short to be told from ordinary text.
func String(s string, values ...string) string {
	if len(values) > 1 {
		values = slices.SortedFunc(slices.Values(values), func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	}
	for _, v := range values {
		if v != "" {
			s = strings.ReplaceAll(s, v, Placeholder)
		}
	}
	s = urlPassword.ReplaceAllString(s, "${1}"+Placeholder+"${2}")
	return keyLike.ReplaceAllString(s, "${1}${2}"+Placeholder)
}
