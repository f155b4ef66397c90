package config

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MinTokenLength is the shortest bearer token TokenAdvice does not warn of.
const MinTokenLength = 16

// TokenAdvice returns what serve warns of in the HTTP API's bearer token, which getenv reads
// from http.token_env, and starts with all the same: a token shorter than MinTokenLength, which
// can be guessed (AG_TOKEN=x was taken without a word, found by a security walkthrough). A
// *FieldError of http.token_env that never holds the token. An unset variable is Preflight's.
func (c *Config) TokenAdvice(getenv func(string) string) []error {
	if c.HTTP.TokenEnv == "" {
		return nil
	}
	token := strings.TrimSpace(getenv(c.HTTP.TokenEnv))
	if n := utf8.RuneCountInString(token); n == 0 || n >= MinTokenLength {
		return nil
	}
	return []error{&FieldError{Field: "http.token_env", Value: c.HTTP.TokenEnv, Err: fmt.Errorf("holds a token shorter than %d "+
		"characters, which can be guessed: use a long random one, such as the output of openssl rand -hex 32", MinTokenLength)}}
}
