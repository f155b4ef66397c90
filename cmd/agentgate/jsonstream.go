package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
)

// jsonStream writes one indented JSON value piece by piece, in exactly the form writeJSON gives
// the whole value (two-space indent, HTML left unescaped, a final newline), so that a command
// can print an object whose arrays it reads a page at a time. The first write error sticks:
// every later call does nothing, and end returns it.
type jsonStream struct {
	w     *bufio.Writer
	empty []bool // per open container: no element written yet
	buf   bytes.Buffer
	err   error
}

func newJSONStream(w io.Writer) *jsonStream { return &jsonStream{w: bufio.NewWriter(w)} }

// open starts a container: head is "{" or "[" as an element of the enclosing array, or
// `"name": {` / `"name": [` as a member of the enclosing object.
func (j *jsonStream) open(head string) {
	j.element()
	j.write(head)
	j.empty = append(j.empty, true)
}

// close ends the innermost container with tail ("}" or "]").
func (j *jsonStream) close(tail string) {
	n := len(j.empty) - 1
	empty := j.empty[n]
	j.empty = j.empty[:n]
	if !empty {
		j.write("\n" + strings.Repeat("  ", n))
	}
	j.write(tail)
}

// field writes the member name: v of the innermost (object) container.
func (j *jsonStream) field(name string, v any) {
	j.element()
	j.write(`"` + name + `": `)
	j.value(v)
}

// item writes v as the next element of the innermost (array) container.
func (j *jsonStream) item(v any) {
	j.element()
	j.value(v)
}

// end finishes the value with writeJSON's newline and flushes; it returns the first error.
func (j *jsonStream) end() error {
	j.write("\n")
	if j.err == nil {
		j.err = j.w.Flush()
	}
	return j.err
}

// flush writes out what is buffered, so that a caller that prints a page at a time holds no
// more than one.
func (j *jsonStream) flush() {
	if j.err == nil {
		j.err = j.w.Flush()
	}
}

// element begins the next element of the innermost container: its separator and indent.
func (j *jsonStream) element() {
	n := len(j.empty)
	if n == 0 {
		return
	}
	if !j.empty[n-1] {
		j.write(",")
	}
	j.empty[n-1] = false
	j.write("\n" + strings.Repeat("  ", n))
}

func (j *jsonStream) value(v any) {
	if j.err != nil {
		return
	}
	j.buf.Reset()
	enc := json.NewEncoder(&j.buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent(strings.Repeat("  ", len(j.empty)), "  ")
	if j.err = enc.Encode(v); j.err == nil {
		_, j.err = j.w.Write(bytes.TrimSuffix(j.buf.Bytes(), []byte("\n")))
	}
}

func (j *jsonStream) write(s string) {
	if j.err == nil {
		_, j.err = j.w.WriteString(s)
	}
}
