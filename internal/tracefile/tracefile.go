// Package tracefile runs data-driven trace tests, in the manner of
// CockroachDB's datadriven files: a file in testdata/ holds commands, each
// with optional input lines, a "----" line and the output the command is
// expected to print; lines starting with # between them are comments.
//
//	# 200/s with a burst of 400: 400 at once.
//	take n=400
//	----
//	admitted 400, remaining 0
//
// Run executes each command with a function of the test's own and compares
// what it returns with the expected output. With -rewrite, it writes the
// outputs it got back into the file instead, keeping the comments.
package tracefile

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of trace files from this run")

// Generated requires the file at path to hold got, a document generated
// from code (a reference): with -rewrite, it writes got there instead. how
// is the command that regenerates it, for the failure's message.
func Generated(t *testing.T, path, got, how string) {
	t.Helper()
	if *rewrite {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Fatalf("%s is not what the code generates; %s", path, how)
	}
}

// Cmd is one command of a trace file.
type Cmd struct {
	// Name is the command's first word.
	Name string
	// Args are its key=value arguments, and Words the others.
	Args  map[string]string
	Words []string
	// Input is the lines between the command and "----".
	Input []string
	// Pos is file:line of the command, for messages.
	Pos string
}

// block is a command with the lines around it, as read.
type block struct {
	comments []string // lines before the command (comments and blanks)
	cmd      Cmd
	raw      []string // the command and input lines as written
	want     string
}

// Run runs every command of the trace file at path through do, in order,
// and requires its output to match. do returns the command's output (one
// or more lines, no blank ones) or fails the test.
func Run(t *testing.T, path string, do func(t *testing.T, c *Cmd) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, tail, err := parse(path, string(data))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, b := range blocks {
		got := strings.TrimRight(do(t, &b.cmd), "\n")
		if t.Failed() {
			return
		}
		for _, l := range b.comments {
			out.WriteString(l + "\n")
		}
		for _, l := range b.raw {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n" + got + "\n")
		if !*rewrite && got != b.want {
			t.Fatalf("%s: %s\ngot:\n%s\nwant:\n%s\n(go test -run %s -rewrite to accept)", b.cmd.Pos, b.raw[0], got, b.want, t.Name())
		}
	}
	for _, l := range tail {
		out.WriteString(l + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// parse reads the blocks of a trace file and the lines after the last.
func parse(path, data string) ([]block, []string, error) {
	lines := strings.Split(strings.TrimRight(data, "\n"), "\n")
	var blocks []block
	var pending []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pending = append(pending, l)
			continue
		}
		b := block{comments: pending, cmd: parseCmd(l, fmt.Sprintf("%s:%d", path, i+1))}
		pending = nil
		b.raw = append(b.raw, l)
		for i++; i < len(lines) && lines[i] != "----"; i++ {
			b.raw = append(b.raw, lines[i])
			b.cmd.Input = append(b.cmd.Input, strings.TrimSpace(lines[i]))
		}
		if i == len(lines) {
			return nil, nil, fmt.Errorf("%s: no ---- after the command", b.cmd.Pos)
		}
		var want []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			want = append(want, lines[i])
		}
		b.want = strings.Join(want, "\n")
		if i < len(lines) {
			pending = append(pending, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks, pending, nil
}

func parseCmd(line, pos string) Cmd {
	f := strings.Fields(line)
	c := Cmd{Name: f[0], Args: map[string]string{}, Pos: pos}
	for _, w := range f[1:] {
		if k, v, ok := strings.Cut(w, "="); ok {
			c.Args[k] = v
		} else {
			c.Words = append(c.Words, w)
		}
	}
	return c
}

// Str returns argument key, or def when the command has none.
func (c *Cmd) Str(key, def string) string {
	if v, ok := c.Args[key]; ok {
		return v
	}
	return def
}

// Int returns integer argument key, or def.
func (c *Cmd) Int(t *testing.T, key string, def int64) int64 {
	t.Helper()
	v, ok := c.Args[key]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", c.Pos, key, v, err)
	}
	return n
}

// Float returns number argument key, or def.
func (c *Cmd) Float(t *testing.T, key string, def float64) float64 {
	t.Helper()
	v, ok := c.Args[key]
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", c.Pos, key, v, err)
	}
	return f
}

// Duration returns duration argument key, or def.
func (c *Cmd) Duration(t *testing.T, key string, def time.Duration) time.Duration {
	t.Helper()
	v, ok := c.Args[key]
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", c.Pos, key, v, err)
	}
	return d
}
