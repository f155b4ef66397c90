package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestAgentCannotReadTheDaemonsEnvironment: an exec agent, which runs as the daemon's user,
// cannot read the daemon's secrets from /proc/<daemon>/environ, the environment the daemon
// started with. Before, the bearer token withheld from the agent's own environment was one
// `cat /proc/$PPID/environ` away. Run as root, the daemon runs as nobody (root reads any
// process's environment).
func TestAgentCannotReadTheDaemonsEnvironment(t *testing.T) {
	dir, daemonBin := dirForAnotherUser(t, MustBuild(t))
	agent := filepath.Join(dir, "agent.sh")
	script := "#!/bin/sh\ncat >/dev/null\n(tr '\\0' '\\n' < /proc/$PPID/environ) 2>/dev/null | grep '^AGTEST_BEARER=' || echo unreadable\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemonBin, "serve", "--data-dir", data, "--http-addr", "127.0.0.1:0")
	if os.Geteuid() == 0 {
		const nobody = 65534
		if err := os.Chown(data, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	d := MustServeCmd(t, cmd, "AGTEST_BEARER=bearer-secret", "AGENTGATE_HTTP_TOKEN_ENV=AGTEST_BEARER",
		"AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_AGENT_EXEC_COMMAND=["+agent+"]")
	req, err := http.NewRequest(http.MethodPost, d.base+"/v1/messages?wait=30s", strings.NewReader(`{"chat_id":"c","user_id":"u","text":"env?"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer bearer-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"text":"unreadable"`) {
		t.Errorf("the agent read the daemon's environment: %d %s, want its reply \"unreadable\"", resp.StatusCode, body)
	}
}
