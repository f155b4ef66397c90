package discord_test

import (
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
)

// TestRefusedTokenStaysDownAndSaysWhy: a token the gateway refuses (close 4004) is logged once
// at error, naming the variable it came from, and /readyz says what to do; the platform is not
// restarted, since the token is read at start and every try would be refused the same way.
// Before, the refusal was a warning repeated at each restart, which read as a network problem.
func TestRefusedTokenStaysDownAndSaysWhy(t *testing.T) {
	w := startWorldNotReady(t, echoAgent, func(*config.Config) { t.Setenv(tokenEnv, "wrong-token") })
	const line = "discord refused the bot token; the platform stays down until the daemon is restarted with the right one"
	eventually(t, "the refusal logged", func() bool { return strings.Contains(w.log.String(), line) })
	if got := readyz(t, w); !strings.Contains(got, "set the right one in $"+tokenEnv+" and restart the daemon") {
		t.Errorf("/readyz = %s, want Discord's refusal of the token and what to do", got)
	}
	w.stop(t)
	log := w.log.String()
	for l := range strings.Lines(log) {
		if strings.Contains(l, line) && (!strings.Contains(l, "level=ERROR") || !strings.Contains(l, "token_env="+tokenEnv)) {
			t.Errorf("refusal logged as %q, want an ERROR naming token_env=%s", l, tokenEnv)
		}
	}
	if n := strings.Count(log, line); n != 1 {
		t.Errorf("refusal logged %d times, want once", n)
	}
	if strings.Contains(log, "platform stopped; restarting") {
		t.Errorf("the platform was restarted after the refusal:\n%s", log)
	}
}

// TestBotPrefixedTokenIsTaken: a token set in the Authorization header's form ("Bot …", as
// guides show it), with a newline after it, connects: it was sent as "Bot Bot …", and refused.
func TestBotPrefixedTokenIsTaken(t *testing.T) {
	w := newWorld(t, echoAgent, nil)
	t.Setenv(tokenEnv, "Bot "+w.srv.Token()+"\n")
	w.start(t)
	w.srv.WaitReady(t)
}
