package exec

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// checkFormat checks what the kernel checks when it runs the executable file at path: that it
// is a program, or a script whose #! line names an interpreter that is there. A script without
// one runs from a shell (which reads it itself when execve refuses it), so its author sees it
// work; execve alone, as agentgate runs it, refuses it with ENOEXEC, and a missing interpreter
// with ENOENT for a file that is plainly there. A file it cannot read is left to execve.
func checkFormat(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, 256) // the kernel reads no more of a #! line (BINPRM_BUF_SIZE)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	interp, ok := bytes.CutPrefix(head, []byte("#!"))
	if !ok {
		if bytes.HasPrefix(head, []byte("\x7fELF")) || binfmtMiscRuns(path, head) {
			return nil
		}
		return fmt.Errorf("exec agent: command %q is no program and has no #! line (start it with one, such as #!/bin/sh, or run it through its interpreter: [sh, %s])", path, path)
	}
	// The kernel reads the interpreter's path as it is written, after spaces and tabs, up to a
	// space, tab or newline: a carriage return (a script saved with CRLF line ends) is part of
	// it. It does not look it up in PATH (a relative one is taken from the working directory)
	// and runs it whatever its own format.
	interp = bytes.TrimLeft(interp, " \t")
	if i := bytes.IndexAny(interp, " \t\n\x00"); i >= 0 {
		interp = interp[:i]
	}
	if len(interp) == 0 {
		return fmt.Errorf("exec agent: command %q has a #! line that names no interpreter", path)
	}
	name := string(interp)
	st, err := os.Stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("exec agent: command %q cannot be run: the interpreter its #! line names does not exist: %q", path, name)
	case err != nil:
		return fmt.Errorf("exec agent: command %q cannot be run: the interpreter its #! line names cannot be: %v", path, err)
	case st.IsDir() || st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("exec agent: command %q cannot be run: the interpreter its #! line names is not executable: %q", path, name)
	}
	return nil
}

// binfmtMiscRuns reports whether one of the kernel's handlers for other executable formats
// (binfmt_misc: a Java jar, a Windows program under Wine, a file by its extension) takes the
// file at path, which begins with head.
func binfmtMiscRuns(path string, head []byte) bool {
	const dir = "/proc/sys/fs/binfmt_misc"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Name() == "register" || e.Name() == "status" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !binfmtMatches(string(b), path, head) {
			continue
		}
		return true
	}
	return false
}

// binfmtMatches reports whether the binfmt_misc entry described by entry (the text of its file
// under /proc/sys/fs/binfmt_misc) takes the file at path that begins with head. An entry it
// cannot read counts as one that does: the check must never refuse a file the kernel runs.
func binfmtMatches(entry, path string, head []byte) bool {
	var offset int
	var magic, mask []byte
	for line := range strings.Lines(entry) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		var err error
		switch key {
		case "disabled":
			return false
		case "extension":
			return strings.HasSuffix(filepath.Base(path), value)
		case "offset":
			offset, err = strconv.Atoi(value)
		case "magic":
			magic, err = hex.DecodeString(value)
		case "mask":
			mask, err = hex.DecodeString(value)
		}
		if err != nil {
			return true
		}
	}
	if magic == nil || offset < 0 || offset+len(magic) > len(head) {
		return magic == nil
	}
	for i, m := range magic {
		b := head[offset+i]
		if i < len(mask) {
			b &= mask[i]
		}
		if b != m {
			return false
		}
	}
	return true
}
