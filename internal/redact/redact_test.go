package redact_test

import (
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/redact"
)

// TestString: what looks like a credential is replaced, and what an operator needs to read in a
// failed command's output or an endpoint's error (hashes, commit ids, base64, prompts, URLs
// without a password) is left.
func TestString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		in     string
		values []string
		want   string
	}{
		{name: "a value", in: "login with MTA5.bot-token.xyz failed", values: []string{"MTA5.bot-token.xyz"}, want: "login with [redacted] failed"},
		{name: "an empty value is ignored", in: "abc", values: []string{""}, want: "abc"},
		{name: "a value that holds another", in: "pw s3cret-and-more", values: []string{"s3cret", "s3cret-and-more"}, want: "pw [redacted]"},
		{name: "a value after Bearer", in: "Authorization: Bearer s3cret-value, Basic", values: []string{"s3cret-value"},
			want: "Authorization: Bearer [redacted], Basic"},
		{name: "bearer token", in: "Authorization: Bearer eyJhbGciOi.x-y", want: "Authorization: Bearer [redacted]"},
		{name: "named values", in: `api_key=k1 "password": "p w" TOKEN: t3 secret='s4' api-key:k5 passwd=k6 access_token=k7`,
			want: `api_key=[redacted] "password": "[redacted]" TOKEN: [redacted] secret='[redacted]' api-key:[redacted] passwd=[redacted] access_token=[redacted]`},
		{name: "prefixed keys", in: "sk-proj-abcdefgh12 ghp_0123456789abcdefghij0123 xoxb-1234567890-abc",
			want: "[redacted] [redacted] [redacted]"},
		{name: "ordinary words are left", in: "input_tokens: 12, max_tokens=5, key: value", want: "input_tokens: 12, max_tokens=5, key: value"},
		{name: "basic credentials", in: "Authorization: Basic dXNlcjpzM2NyZXQ=\nproxy-authorization:basic YTpi",
			want: "Authorization: Basic [redacted]\nproxy-authorization:basic [redacted]"},
		{name: "basic credentials quoted", in: `{"Authorization": "Basic dXNlcjpzM2NyZXQ="} map[Authorization:[Basic dXNlcjpw]]`,
			want: `{"Authorization": "Basic [redacted]"} map[Authorization:[Basic [redacted]]]`},
		{name: "basic without authorization is left", in: "Basic usage: agent --help", want: "Basic usage: agent --help"},
		{name: "passwords in URLs", in: "dial postgres://agent:s3cret@db/x: refused; GET https://u:p@host/path; redis://:pw@cache:6379",
			want: "dial postgres://agent:[redacted]@db/x: refused; GET https://u:[redacted]@host/path; redis://:[redacted]@cache:6379"},
		{name: "a password with @ and :", in: `{"dsn":"amqp://bot:p@s:s@mq/vhost"}`, want: `{"dsn":"amqp://bot:[redacted]@mq/vhost"}`},
		{name: "a password with / ? and #", in: "dial postgres://agent:ab/cd+ef==@db/x: refused; postgres://agent:pa?ss@db redis://u:a#b/c@cache:6379/0",
			want: "dial postgres://agent:[redacted]@db/x: refused; postgres://agent:[redacted]@db redis://u:[redacted]@cache:6379/0"},
		{name: "a password runs to the word's last @", in: `dsn='mysql://u:p@ss/w@rd@db:3306/x' next@word`,
			want: `dsn='mysql://u:[redacted]@db:3306/x' next@word`},
		{name: "URLs without a password are left", in: "http://host/path https://user@host, http://[::1]:80 user@example.com, ratio a:b https://user@host:8080/x?to=a@b",
			want: "http://host/path https://user@host, http://[::1]:80 user@example.com, ratio a:b https://user@host:8080/x?to=a@b"},
		// Over-redaction: a password may hold / ? # unescaped (a base64 one), so it runs to the
		// word's last @, and a port before an @ in the path or query reads as a password too.
		{name: "a port before an @ in the query is taken for a password", in: "http://host:8080/x?to=a@b",
			want: "http://host:[redacted]@b"},
		{name: "a port and a mail address apart are left", in: "http://host:8080 ann@example.com", want: "http://host:8080 ann@example.com"},
		{name: "a prompt at a line's end", in: "Password:\nnext line", want: "Password:\nnext line"},
		{name: "bearer at a line's end", in: "scheme Bearer\nnext line", want: "scheme Bearer\nnext line"},
		{name: "hashes, commit ids and base64 are left",
			in:   "fatal: bad object 9fceb02d0ae598e95dc970b74767f19372d61af8\nsha256:" + strings.Repeat("e3b0c442", 8) + " data=" + strings.Repeat("QUJDREVGR0g", 6) + " test_a_function_with_a_very_long_descriptive_name",
			want: "fatal: bad object 9fceb02d0ae598e95dc970b74767f19372d61af8\nsha256:" + strings.Repeat("e3b0c442", 8) + " data=" + strings.Repeat("QUJDREVGR0g", 6) + " test_a_function_with_a_very_long_descriptive_name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.String(tc.in, tc.values...); got != tc.want {
				t.Errorf("String(%q, %q) = %q, want %q", tc.in, tc.values, got, tc.want)
			}
		})
	}
}

// TestStringSecretShapes: the shapes in which a command's stderr gives a secret away are
// redacted (found by a walkthrough: a name that only held token, secret or password, a flag's
// value, a cookie, Stripe's keys were logged whole), and prose and data that merely name one are
// left, so that the operator can still read why the command failed.
func TestStringSecretShapes(t *testing.T) {
	t.Parallel()
	redacted := []struct{ name, in, want string }{
		{"a name with secret inside", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
			"AWS_SECRET_ACCESS_KEY=[redacted]"},
		{"ini with blanks", "aws_secret_access_key = wJalrXUtnFEMI", "aws_secret_access_key = [redacted]"},
		{"a Stripe key by name and prefix", "STRIPE_SECRET_KEY=sk_live_51HaBcDeFgHiJkLmN and sk_test_4eC39HqLyjWDarjtT1zdp7dc",
			"STRIPE_SECRET_KEY=[redacted] and [redacted]"},
		{"a restricted key and a webhook secret", "rk_live_abcdefgh12345678 whsec_0123456789abcdefABCDEF", "[redacted] [redacted]"},
		{"a private key by name", "PRIVATE_KEY=MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "PRIVATE_KEY=[redacted]"},
		{"yaml", "  secret_key: abc123def\n  db.password: hunter2x", "  secret_key: [redacted]\n  db.password: [redacted]"},
		{"json, quoted with a blank and an escape", `{"client_secret": "a b\"c", "id_token":"eyJh.x.y"}`,
			`{"client_secret": "[redacted]", "id_token":"[redacted]"}`},
		{"camel case", "accessToken: abc123 clientSecret=xyz apiKey='k9'", "accessToken: [redacted] clientSecret=[redacted] apiKey='[redacted]'"},
		{"a credential and a passphrase", "GOOGLE_CREDENTIALS=ewogICJ0eXBlIjog SSH_PASSPHRASE=correct-horse",
			"GOOGLE_CREDENTIALS=[redacted] SSH_PASSPHRASE=[redacted]"},
		{"a quote left open by a cut", `password="hunter2x`, `password="[redacted]`},
		{"flags", `run --password hunter2x --api-key=k-123 -token abc --secret "two words" --db-password 'p w'`,
			`run --password [redacted] --api-key=[redacted] -token [redacted] --secret "[redacted]" --db-password '[redacted]'`},
		{"a header with token in its name", "X-Auth-Token: 0123abcd\nx-api-key: abc", "X-Auth-Token: [redacted]\nx-api-key: [redacted]"},
		// Before, the name's first word went, and the token after it stayed (found by a review).
		{"a named value that begins with Bearer", "X-Auth-Token: Bearer abc123def456ghi\naccess_token: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln",
			"X-Auth-Token: [redacted] [redacted]\naccess_token: [redacted] [redacted]"},
		{"an authorization header as a CGI variable or in snake case", "HTTP_AUTHORIZATION=Basic dXNlcjpodW50ZXIy\nproxy_authorization: Basic dXNlcjpodW50ZXIy",
			"HTTP_AUTHORIZATION=Basic [redacted]\nproxy_authorization: Basic [redacted]"},
		{"an indented key's tail (YAML)", "  MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n  -----END PRIVATE KEY-----",
			"[redacted]\n  -----END PRIVATE KEY-----"},
		{"cookies", "> Cookie: session=abc123; theme=dark\n< set-cookie: sid=xyz; Path=/; HttpOnly\nnext",
			"> Cookie: [redacted]\n< set-cookie: [redacted]; HttpOnly\nnext"},
		{"cookies in a Go header map and JSON", `map[Cookie:[sid=abc]] {"Set-Cookie": "sid=abc; Secure"}`,
			`map[Cookie:[[redacted]]] {"Set-Cookie": "[redacted]; Secure"}`},
		{"authorization with other schemes", "Authorization: token ghp_short\nAuthorization: Bot MTA5.x.y\n" +
			"authorization: AWS4-HMAC-SHA256 Credential=AKIAX/20260101/s3, Signature=fe5f80f7",
			"Authorization: token [redacted]\nAuthorization: Bot [redacted]\nauthorization: AWS4-HMAC-SHA256 [redacted], Signature=[redacted]"},
		{"authorization without a scheme", "Authorization: 0a1b2c3d4e rejected\n" + `{"authorization":"lin_api_abcdefghijklmnop"}`,
			"Authorization: [redacted] rejected\n" + `{"authorization":"[redacted]"}`},
		{"a header and what follows it on its line", "proxy: Authorization: Basic dXNlcjpw refused; Cookie: sid=abc; a=b, then https://host/x",
			"proxy: Authorization: Basic [redacted] refused; Cookie: [redacted], then https://host/x"},
		// A value runs over & (a password may hold one), so the rest of a query goes with it.
		{"a presigned URL", "GET https://b.s3.amazonaws.com/k?X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0&X-Amz-Expires=60 403",
			"GET https://b.s3.amazonaws.com/k?X-Amz-Signature=[redacted] 403"},
		{"more prefixes", "github_pat_11ABCDEFG0123456789_abcdef glpat-abcdefghij0123456789 xapp-1-A0123-4567890 " +
			"AIzaSyA-0123456789abcdefghijklmnopqrstu npm_" + strings.Repeat("a1", 18) + " hf_" + strings.Repeat("aB", 17),
			"[redacted] [redacted] [redacted] [redacted] [redacted] [redacted]"},
		{"a PEM private key", "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nx+y/z==\n-----END RSA PRIVATE KEY-----\ndone",
			"key:\n-----BEGIN RSA PRIVATE KEY-----[redacted]-----END RSA PRIVATE KEY-----\ndone"},
		{"a PEM private key cut at its end", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq", "-----BEGIN PRIVATE KEY-----[redacted]"},
		{"a PEM private key cut at its start", "kqhkiG9w0BAQEF\nAASCBKcwggSj\n-----END PRIVATE KEY-----\ndone",
			"[redacted]\n-----END PRIVATE KEY-----\ndone"},
	}
	kept := []struct{ name, in string }{
		{"prose about a token", "the token was rejected; check your password and secret settings"},
		{"prose about headers", "authorization: permission denied; the cookie was stale; Authorization: Bearer\nAuthorization: AWS4-HMAC-SHA256"},
		{"a cookie without a value", "cookie: required"},
		{"names of something else", "token_count: 12 tokenizer: cl100k secretary: Ann max_tokens=5 passwords: 3 token_type: Bearer"},
		{"where a secret is, not what", "PASSWORD_FILE=/run/secrets/db AGENTGATE_HTTP_TOKEN_ENV=AGENTGATE_HTTP_TOKEN --token-file /etc/t secret_name=prod-db"},
		{"an empty value", `password="" token=''`},
		{"a flag without a value", "use --no-password --verbose, or --token <token>"},
		{"a certificate", "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----"},
		{"a prefix inside a word or too short", "task_live_x sk-short mask_test_abc"},
	}
	for _, tc := range redacted {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.String(tc.in); got != tc.want {
				t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	for _, tc := range kept {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.String(tc.in); got != tc.in {
				t.Errorf("String(%q) = %q, want it unchanged", tc.in, got)
			}
		})
	}
}

// TestStringFlagUsageOverRedacts pins a price of redacting flags' values: a usage line's
// placeholder after a secret flag reads as its value.
func TestStringFlagUsageOverRedacts(t *testing.T) {
	t.Parallel()
	in, want := "  -token string\n    \tthe API token", "  -token [redacted]\n    \tthe API token"
	if got := redact.String(in); got != want {
		t.Errorf("String(%q) = %q, want %q", in, got, want)
	}
}

// TestStringLeavesValuesAlone: String sorts a copy of the values it is given, not the caller's
// slice, which the exec agent keeps for the life of the agent.
func TestStringLeavesValuesAlone(t *testing.T) {
	t.Parallel()
	values := []string{"short", "a-longer-value"}
	redact.String("x", values...)
	if values[0] != "short" || values[1] != "a-longer-value" {
		t.Errorf("values after String = %q, want them in the order given", values)
	}
}
