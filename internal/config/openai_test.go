package config

import (
	"strings"
	"testing"
)

// TestOpenAIBaseURLWithUserInfoOrFragment: check-config refuses a base_url with user info (a
// secret in the file, sent as Basic credentials or dropped) or a fragment (never sent), with a
// problem that names the key and its line and does not quote the URL.
func TestOpenAIBaseURLWithUserInfoOrFragment(t *testing.T) {
	for _, tt := range []struct{ name, url, want string }{
		{"user info", "https://proxyuser:hunter2pw@llm.example.com/v1",
			":4: agent.openai.base_url: must not hold user info (user:password@): give the API key through agent.openai.api_key_env"},
		{"user alone", "https://proxyuser@llm.example.com/v1",
			":4: agent.openai.base_url: must not hold user info (user:password@): give the API key through agent.openai.api_key_env"},
		{"fragment", "https://llm.example.com/v1#x",
			":4: agent.openai.base_url: must not hold a fragment (#…): an HTTP client never sends it, so it means nothing here"},
		{"empty fragment", "http://127.0.0.1:8000/v1#",
			":4: agent.openai.base_url: must not hold a fragment (#…): an HTTP client never sends it, so it means nothing here"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := MustWriteConfig(t, "agent:\n  backend: openai\n  openai:\n    base_url: \""+tt.url+"\"\n    model: m\n")
			_, err := Load(path, nil, nil)
			if err == nil || err.Error() != path+tt.want {
				t.Fatalf("Load(base_url %q) = %v, want %s%s", tt.url, err, path, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2pw") {
				t.Errorf("Load(base_url %q) = %v, quotes the password", tt.url, err)
			}
		})
	}
	for _, url := range []string{"https://llm.example.com/v1?api-version=2024-06-01", "http://127.0.0.1:8000/v1/"} {
		c := Default()
		c.Agent.Backend, c.Agent.OpenAI.BaseURL, c.Agent.OpenAI.Model = "openai", url, "m"
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(base_url %q) = %v, want nil", url, err)
		}
	}
}
