package config

import (
	"errors"
	"net/url"
)

// OpenAIAdvice returns what serve warns of in the openai backend's settings, which it starts
// with all the same: an API key sent over plain http to a host that is not this one (anyone on
// the way reads it). A *FieldError of agent.openai.base_url. check-config says it before a
// deploy, where serve's own warning comes only once the daemon runs (found by a walkthrough).
func (c *Config) OpenAIAdvice() []error {
	o := c.Agent.OpenAI
	if c.Agent.Backend != "openai" || o.APIKeyEnv == "" {
		return nil
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || u.Scheme != "http" || LoopbackHost(u.Hostname()) {
		return nil // (a bad URL is a problem said apart)
	}
	return []error{&FieldError{Field: "agent.openai.base_url", Err: errors.New(
		"sends the API key over plain http to " + u.Hostname() + ", where anyone on the way can read it: use https")}}
}
