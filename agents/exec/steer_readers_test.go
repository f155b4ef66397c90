package exec_test

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
)

// TestRunSteerReaders: a steering command that reads stdin without read-ahead (as README
// "Plugging in an agent" shows for sh, Python and Go) leaves the steer lines it has not read in
// the pipe, where Run counts their messages unseen, to run as the next turn. One that reads
// through a buffer (Python's sys.stdin, Go's bufio) takes the lines behind the one it reads
// into its buffer, and Run counts them seen, whether or not it looks at them: the README warns
// of it. Each command waits, before it reads, until three messages are steered, then reads the
// input object and one steer line and answers.
func TestRunSteerReaders(t *testing.T) {
	t.Parallel()
	const awaitRead = `while [ ! -e "$1/read" ]; do sleep 0.01; done; `
	python := func(open, read string) []string {
		return []string{"python3", "-c", `import json, os, sys, time
while not os.path.exists(os.path.join(sys.argv[1], "read")):
    time.sleep(0.01)
` + open + `
turn = json.loads(` + read + `)
steer = json.loads(` + read + `)["steer"]
print(turn["messages"][-1]["text"], "/", steer["text"])`}
	}
	tests := []struct {
		name      string
		command   []string // the marker dir is appended
		readAhead bool
		reply     string
	}{
		{name: "sh read -r", command: []string{"/bin/sh", "-c", awaitRead + `IFS= read -r line; IFS= read -r line; echo read 2`, "sh"},
			reply: "read 2"},
		{name: "Go, a byte at a time", command: steerReader("bytewise"), reply: "hi / steer 1"},
		{name: "Go bufio", command: steerReader("bufio"), readAhead: true, reply: "hi / steer 1"},
		{name: "Python, unbuffered", command: python(`stdin = open(0, "rb", buffering=0)`, "stdin.readline()"),
			reply: "hi / steer 1"},
		{name: "Python sys.stdin", command: python("", "sys.stdin.readline()"), readAhead: true, reply: "hi / steer 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := osexec.LookPath(tc.command[0]); err != nil {
				// The sh and Go cases check the same protocol on every machine.
				t.Skipf("%s is not on this machine, so the README's snippet for it is not run here: %v", tc.command[0], err)
			}
			dir := t.TempDir()
			a := MustNew(t, exec.Config{Command: append(tc.command, dir), Steer: true})
			steer := make(chan agents.Message)
			defer close(steer)
			req := request(turn(1), "hi")
			req.Steer = steer
			done := runAsync(t.Context(), a, req)
			for i := 1; i <= 3; i++ {
				// Run takes each message once it has written the line before it.
				mustSend(t, steer, agents.Message{Role: "user", Text: fmt.Sprintf("steer %d", i), MessageID: fmt.Sprintf("m%d", i)})
			}
			if err := os.WriteFile(filepath.Join(dir, "read"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			r := mustResult(t, done)
			if r.err != nil || r.resp.Text != tc.reply {
				t.Fatalf("Run() = %+v, %v; want the reply %q", r.resp, r.err, tc.reply)
			}
			// Steer 1 was read. Steer 2 was whole in the pipe when the command read; steer 3
			// may have been written after it read, or not at all.
			if tc.readAhead && r.resp.Unseen > 1 {
				t.Errorf("Run() Unseen = %d, want at most 1 (steer 2 read ahead into the command's buffer)", r.resp.Unseen)
			}
			if !tc.readAhead && r.resp.Unseen != 2 {
				t.Errorf("Run() Unseen = %d, want 2 (steer 2 and 3 never read)", r.resp.Unseen)
			}
		})
	}
}

// steerReader is the command that runs the test binary as TestSteerReaderProcess, reading stdin
// as mode says.
func steerReader(mode string) []string {
	return []string{os.Args[0], "-test.run=^TestSteerReaderProcess$", "-test.count=1", mode}
}

// TestSteerReaderProcess is a steering agent's command for TestRunSteerReaders, not a test
// itself: its arguments are how it reads stdin (bytewise, a byte at a time, as README shows for
// Go; bufio, through a bufio.Reader) and the marker dir. It waits for the dir's "read" file,
// reads the input object and one steer line, and answers the texts of both.
func TestSteerReaderProcess(t *testing.T) {
	args := flag.Args()
	if len(args) != 2 {
		t.Skip("run by TestRunSteerReaders as an agent's command")
	}
	mode, dir := args[0], args[1]
	for {
		if _, err := os.Stat(filepath.Join(dir, "read")); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // a subprocess's poll for the test's marker
	}
	readLine := readByteWise
	if mode == "bufio" {
		readLine = bufio.NewReader(os.Stdin).ReadBytes
	}
	var in struct{ Messages []agents.Message }
	var steer struct{ Steer agents.Message }
	for _, v := range []any{&in, &steer} {
		line, err := readLine('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := json.Unmarshal(line, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	fmt.Println(in.Messages[len(in.Messages)-1].Text, "/", steer.Steer.Text)
	os.Exit(0) // before the test framework writes its verdict to stdout
}

// readByteWise reads stdin up to and including delim one byte at a time: nothing behind the line
// leaves the pipe.
func readByteWise(delim byte) ([]byte, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := os.Stdin.Read(b)
		if n == 1 {
			line = append(line, b[0])
			if b[0] == delim {
				return line, nil
			}
		}
		if err == io.EOF && len(line) > 0 {
			return line, nil
		}
		if err != nil {
			return line, err
		}
	}
}
