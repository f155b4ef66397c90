// Package redact takes what looks like a credential out of text that agentgate logs, or puts in
// an error, but did not write itself: the output of a failed exec command, the error a model
// endpoint answered. Both agents use this one set of rules, so that what the README lists as
// redacted holds for each of them.
//
// Every rule keys on what names a secret (Bearer, an Authorization or Cookie header, a name such
// as AWS_SECRET_ACCESS_KEY= or "password": or --token, a URL's user information, a PEM private
// key's armour) or on a key's documented prefix (sk-, sk_live_, ghp_, xoxb-). None matches a
// bare run of token characters: a command's stderr is full of git commit ids (40 hex digits),
// SHA-256 sums, base64 blobs and long identifiers, which the operator reading the log may need.
// Nor does a name alone: "the token was rejected" is prose, kept; "token: abc" is a value. A
// caller whose text is more likely to hold an opaque token than such data adds a rule of its
// own (the openai agent does).
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

// pemKey matches a PEM private key, from its BEGIN line to its END line or, cut, to the end of
// the text; the groups keep the armour lines. pemKeyEnd matches the base64 lines before an END
// line whose BEGIN line was cut off (the tail of a command's output). Neither matches a
// certificate or a public key.
var (
	pemKey    = regexp.MustCompile(`(?s)(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----).*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)`)
	pemKeyEnd = regexp.MustCompile(`(?m)(?:^[ \t]*[A-Za-z0-9+/=]+\r?\n)+([ \t]*-----END [A-Z0-9 ]*PRIVATE KEY-----)`)
)

// urlPassword matches the password of a URL's user information (postgres://agent:s3cret@db,
// https://u:p@host); the first group keeps the scheme and the user, the second the @ before
// the host. The password runs to the last @ of the URL's word (up to white space, a quote or
// <>), not to the first / ? or # as net/url reads it: a password is often written into a DSN
// unescaped, and one from openssl rand -base64 holds a / (postgres://agent:ab/cd+ef==@db was
// logged whole). The price is a port before an @ in a path or a query: http://host:8080/x?to=a@b
// loses "8080/x?to=a" too. A URL without a password (http://host:8080/path, https://user@host,
// http://[::1]:80) does not match.
var urlPassword = regexp.MustCompile(`(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/?#@"'<>]*:)[^\s"'<>]*(@)`)

// authorization matches an Authorization or Proxy-Authorization header's value, as curl -v,
// Go's http.Header, JSON, a Python dict or a CGI variable (HTTP_AUTHORIZATION) print it: its first word, when blanks follow it
// (groups 2 and 3), and the word after (group 4), each up to white space, a quote, a comma, a
// semicolon or a bracket (a "[" starts a value String replaced first). authValue decides which
// of them is the secret.
var authorization = regexp.MustCompile(`(?i)(\b(?:[A-Za-z0-9]*_)?(?:proxy[-_])?authorization["']?[ \t]*[:=][ \t]*["'\[]?)` +
	`(?:([A-Za-z0-9][A-Za-z0-9\-]*)([ \t]+))?([^\s"',;\[\]]+)?`)

// authSchemes are the Authorization schemes authValue keeps in front of the credentials, in
// lower case.
var authSchemes = map[string]bool{
	"basic": true, "bearer": true, "token": true, "bot": true, "digest": true, "negotiate": true, "ntlm": true,
	"oauth": true, "dpop": true, "apikey": true, "aws4-hmac-sha256": true, "sso-key": true,
}

// cookie matches a Cookie or Set-Cookie header's name=value pairs (sid=abc; theme=dark), all of
// them secrets as far as a log can tell; the group keeps the header's name. A Set-Cookie's
// attributes after the first one without "=" (HttpOnly) are left.
var cookie = regexp.MustCompile(`(?i)(\b(?:set-)?cookie["']?[ \t]*[:=][ \t]*["'\[]?)` +
	`[^\s"'=;,\[\]]+=[^\s"';,\]]*(?:;[ \t]*[^\s"'=;,\[\]]+=[^\s"';,\]]*)*`)

// secretName is a name that holds a secret word anywhere in it (AWS_SECRET_ACCESS_KEY,
// db.password, X-Auth-Token, clientSecret, a presigned URL's X-Amz-Signature): the word must end
// the name or be followed by a digit or a separator, so that max_tokens, tokenizer and
// secretary are names of something else. A name is letters, digits and _ . -, starting at a
// word boundary.
const secretName = `\b(?:[A-Za-z0-9_][A-Za-z0-9_.\-]*?)?` +
	`(?:secrets?|passw(?:or)?d|passphrase|token|api[_-]?key|private[_-]?key|credentials?|signature)` +
	`(?:[0-9_.\-][A-Za-z0-9_.\-]*)?`

// secretValue is the value after a secretName: quoted (to its closing quote, with a JSON
// string's escapes) or a run of characters up to white space, a quote, a comma or a semicolon.
// An opening quote without its closing one (a line cut short) starts a run.
const secretValue = `"(?:[^"\\\r\n]|\\.)*"|'[^'\r\n]*'|["']?[^\s"',;]+`

// named matches a secretName's value after = or : (NAME=value, NAME: value, "name": "value",
// --name=value); the separator may have blanks around it, not a line break ("Password:" at the
// end of a prompt does not make the next line a secret). flagArg matches a command-line flag's
// value after blanks (--password hunter2, -token abc), which must not start as another flag or
// a placeholder (<token>, [redacted]) does. Their groups: what comes before the value, the name
// (flagArg: within the first), the value.
var (
	named   = regexp.MustCompile(`(?i)((` + secretName + `)["']?[ \t]*[:=][ \t]*)(` + secretValue + `)`)
	flagArg = regexp.MustCompile(`(?i)((?:^|[\s"'(])--?(` + secretName + `)[ \t]+)("(?:[^"\\\r\n]|\\.)*"|'[^'\r\n]*'|[^\s"',;<\[{(\-][^\s"',;]*)`)
)

// notSecret are the last parts of a secretName that make it the name of something else than
// the secret: token_count, PASSWORD_FILE, token_type, AGENTGATE_HTTP_TOKEN_ENV. Their values
// are what an operator reads a failed command's output for.
var notSecret = map[string]bool{
	"count": true, "type": true, "file": true, "path": true, "dir": true, "env": true, "name": true, "id": true,
	"url": true, "uri": true, "len": true, "length": true, "limit": true, "budget": true, "size": true, "ttl": true,
}

// keyLike matches a bearer token (the token after Bearer, wherever it is: a command line, a
// request dump) and an API key by its documented prefix: OpenAI's and Anthropic's sk-, Stripe's
// sk_live_ and whsec_, GitHub's ghp_… and github_pat_, GitLab's glpat-, Slack's xox…- and
// xapp-, Google's AIza, npm's npm_, Hugging Face's hf_, PyPI's pypi-. A token never starts with
// "[", which keeps "Bearer [redacted]" (a value String replaced first) from becoming
// "Bearer [redacted]]".
var keyLike = regexp.MustCompile(`(?i)(bearer[ \t]+)[^\s"',;\[\]][^\s"',;\]]*` +
	`|\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}|\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{8,}|\bwhsec_[A-Za-z0-9]{16,}` +
	`|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bglpat-[A-Za-z0-9_\-]{20,}` +
	`|\bxox[abprs]-[A-Za-z0-9\-]{10,}|\bxapp-[A-Za-z0-9\-]{10,}|\bAIza[A-Za-z0-9_\-]{35}` +
	`|\bnpm_[A-Za-z0-9]{36}|\bhf_[A-Za-z0-9]{30,}|\bpypi-[A-Za-z0-9_\-]{50,}`)

// String returns s with every non-empty one of values, PEM private keys, the passwords of URLs,
// the credentials of Authorization and Cookie headers, the values of names that hold a secret
// word and key-like strings replaced by Placeholder. The values are the caller's own secrets,
// replaced wherever they occur, longest first (so that one which holds another leaves none of
// itself behind); the caller decides which are too short to be told from ordinary text.
func String(s string, values ...string) string {
	s = Values(s, values...)
	s = pemKey.ReplaceAllString(s, "${1}"+Placeholder+"${2}")
	s = pemKeyEnd.ReplaceAllString(s, Placeholder+"\n${1}")
	s = urlPassword.ReplaceAllString(s, "${1}"+Placeholder+"${2}")
	s = replaceSubmatch(authorization, s, authValue)
	s = cookie.ReplaceAllString(s, "${1}"+Placeholder)
	// Key-like strings before named values: a name's value is its first word, and the token
	// after the Bearer that a value may begin with (X-Auth-Token: Bearer eyJ…) was left behind
	// once that word was replaced (found by a review).
	s = keyLike.ReplaceAllString(s, "${1}"+Placeholder)
	s = replaceSubmatch(named, s, nameValue)
	return replaceSubmatch(flagArg, s, nameValue)
}

// Values returns s with every non-empty one of values replaced by Placeholder, longest first:
// String's first step, for a caller that changes the text before String's rules read it (the
// exec agent takes colour codes out of a command's output, and a value may hold what reads as
// one, which would leave it in pieces no rule knows).
func Values(s string, values ...string) string {
	if len(values) > 1 {
		values = slices.SortedFunc(slices.Values(values), func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	}
	for _, v := range values {
		if v != "" {
			s = strings.ReplaceAll(s, v, Placeholder)
		}
	}
	return s
}

// Keys returns the API keys of s that keyLike knows by their prefix (sk-…, ghp_…; not a
// token after Bearer, which may be short): for a caller that changes the text before String's
// rules read it, to replace them after (Values) where the change joined one to the word before
// it, a word boundary no more (the exec agent takes the escape sequences out of a command's
// output: "link␛]8;;…␛\sk-…" became "linksk-…", which no rule knew;
// TestStderrKeyAfterAnEscapeSequenceIsRedacted).
func Keys(s string) []string {
	var keys []string
	for _, m := range keyLike.FindAllStringSubmatchIndex(s, -1) {
		if m[2] < 0 { // not a Bearer's token
			keys = append(keys, s[m[0]:m[1]])
		}
	}
	return keys
}

// replaceSubmatch returns s with each match of re replaced by what f makes of its submatches
// (m[0] the match, "" for a group that did not take part).
func replaceSubmatch(re *regexp.Regexp, s string, f func(m []string) string) string {
	locs := re.FindAllStringSubmatchIndex(s, -1)
	if locs == nil {
		return s
	}
	var b strings.Builder
	last := 0
	for _, loc := range locs {
		m := make([]string, len(loc)/2)
		for i := range m {
			if loc[2*i] >= 0 {
				m[i] = s[loc[2*i]:loc[2*i+1]]
			}
		}
		b.WriteString(s[last:loc[0]])
		b.WriteString(f(m))
		last = loc[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// authValue redacts an authorization match: the word after a scheme (Bearer, Basic…), or,
// without a scheme, the first word when it reads as a token (it holds a digit, or is 16
// characters or more), so that "authorization: permission denied" stays.
func authValue(m []string) string {
	prefix, first, blanks, second := m[1], m[2], m[3], m[4]
	switch {
	case authSchemes[strings.ToLower(first)]:
		if second == "" {
			return m[0] // credentials already redacted (they start with "[")
		}
		return prefix + first + blanks + Placeholder
	case first != "":
		if tokenLike(first) {
			return prefix + Placeholder + blanks + second
		}
	case tokenLike(second) && !authSchemes[strings.ToLower(second)]:
		return prefix + Placeholder
	}
	return m[0]
}

// tokenLike reports whether a header's word without a scheme reads as a token rather than a
// word of prose.
func tokenLike(w string) bool {
	return len(w) >= 16 || strings.ContainsAny(w, "0123456789")
}

// nameValue redacts the value of a named or flagArg match, keeping its quotes, unless the name is
// that of something else than the secret (notSecret) or the value is empty.
func nameValue(m []string) string {
	before, name, value := m[1], m[2], m[3]
	parts := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool { return r == '_' || r == '.' || r == '-' })
	if len(parts) > 0 && notSecret[parts[len(parts)-1]] {
		return m[0]
	}
	q := value[:1]
	switch {
	case q != `"` && q != "'":
		return before + Placeholder
	case len(value) == 2 && value[1:] == q:
		return m[0] // "" is no secret, and says the value is empty
	case len(value) > 1 && strings.HasSuffix(value, q):
		return before + q + Placeholder + q
	}
	return before + q + Placeholder
}
