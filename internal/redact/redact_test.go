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
			want: `api_key=[redacted] "password": "[redacted] w" TOKEN: [redacted] secret='[redacted]' api-key:[redacted] passwd=[redacted] access_token=[redacted]`},
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
