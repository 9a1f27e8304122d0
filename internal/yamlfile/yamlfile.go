// Package yamlfile reads the project's YAML files (policies, simulator
// scenarios) so that every problem is reported with the file, the line and
// the dotted field path, e.g. "p.yaml:12: gates[1].rate: ...".
//
//	doc, err := yamlfile.Document("p.yaml", data, "policy")
//	w := &yamlfile.Walker{File: "p.yaml"}
//	w.Fields(doc, "", []string{"version"}, func(k string, v *yaml.Node) { ... })
//	return w.Err()
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a file, at a line, in a field.
type Error struct {
	File  string
	Line  int
	Field string // dotted path, e.g. "gates[1].rate"
	Msg   string
	// Err, if set, is the cause (an error of another package, whose
	// message Msg repeats): errors.Is and errors.As see it.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// Errors is every problem found in a file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap returns the errors, so that errors.Is and errors.As look into
// each one.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// Document parses data as exactly one YAML document and returns its root
// node. Tabs in indentation, syntax errors, an empty file and more than one
// document are Errors; what names the file's kind in messages ("policy").
func Document(path string, data []byte, what string) (*yaml.Node, error) {
	for i, line := range strings.Split(string(data), "\n") {
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
		if strings.Contains(indent, "\t") && strings.TrimSpace(line) != "" {
			return nil, Errors{{File: path, Line: i + 1, Field: "(yaml)", Msg: "a tab in the indentation: YAML indents with spaces only"}}
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := syntaxError(err)
		line = problemLine(data, line, msg)
		return nil, Errors{{File: path, Line: line, Field: "(yaml)", Msg: msg + " (check indentation and quoting)"}}
	}
	if len(doc.Content) == 0 {
		return nil, Errors{{File: path, Line: 1, Field: "(file)", Msg: "empty " + what + " file"}}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first, second yaml.Node
	if dec.Decode(&first) == nil {
		if err := dec.Decode(&second); err == nil {
			return nil, Errors{{File: path, Line: second.Line, Field: "(file)", Msg: "more than one YAML document (---): a " + what + " file holds one"}}
		}
	}
	return doc.Content[0], nil
}

// HasKey reports whether n is a mapping with key among its keys.
func HasKey(n *yaml.Node, key string) bool {
	if n == nil || n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return true
		}
	}
	return false
}

// syntaxError returns the line the YAML parser reports and its message
// without "yaml: line N:".
func syntaxError(err error) (int, string) {
	line := 1
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = yamlLine.ReplaceAllString(msg, "")
	return line, strings.TrimLeft(msg, ": ")
}

// problemLine finds the line of a syntax error. For an error inside a
// block, the YAML parser reports the line where the enclosing block begins
// (its context mark: go.yaml.in/yaml/v3 decode.go, parser.fail), not the
// line at fault: a line indented one space too few at the end of a gate
// was reported at the "gates:" line above. The line at fault is the first
// one, from the reported line on, whose prefix of the file fails with the
// same message; when none does (the message depends on what follows), the
// reported line stands.
func problemLine(data []byte, reported int, msg string) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 2000 {
		return reported // bounded work for huge files
	}
	var prefix []byte
	for i, l := range lines {
		prefix = append(prefix, l...)
		if i+1 < reported {
			continue
		}
		var n yaml.Node
		err := yaml.Unmarshal(prefix, &n)
		if err == nil {
			continue
		}
		if _, m := syntaxError(err); m == msg {
			return i + 1
		}
	}
	return reported
}

// Walker collects errors while a parser walks a document.
type Walker struct {
	File string
	Errs Errors
}

// Err returns the errors found, sorted by line, or nil.
func (w *Walker) Err() error {
	if len(w.Errs) == 0 {
		return nil
	}
	slices.SortStableFunc(w.Errs, func(a, b *Error) int { return a.Line - b.Line })
	return w.Errs
}

// Float parses a number in [lo, hi].
func (w *Walker) Float(v *yaml.Node, field string, lo, hi float64) float64 {
	if v.Kind != yaml.ScalarNode {
		w.Errf(v, field, "want a number, got %s", KindName(v))
		return 0
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64)
	if err != nil || f != f {
		w.Errf(v, field, "%q is not a number", clip(v.Value))
		return 0
	}
	if f < lo || f > hi {
		if lo == math.SmallestNonzeroFloat64 {
			w.Errf(v, field, "%v is out of range: want > 0 and ≤ %v", f, hi)
		} else {
			w.Errf(v, field, "%v is out of range [%v, %v]", f, lo, hi)
		}
		return 0
	}
	return f
}

// durationSyntax is what time.ParseDuration accepts, whatever the size: a
// value that matches it and still fails has overflowed.
var durationSyntax = regexp.MustCompile(`^[-+]?([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+$`)

// clip shortens a value quoted in an error message.
func clip(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// maxMsg bounds a message: a value quoted in it (a name of megabytes) is
// cut, so that a refused file is not logged at its own size.
const maxMsg = 400

// Errf records an error at n's line in field.
func (w *Walker) Errf(n *yaml.Node, field, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxMsg {
		cut := maxMsg - 3
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "..."
	}
	w.Errs = append(w.Errs, &Error{File: w.File, Line: n.Line, Field: field, Msg: msg})
}

// MaxFileSize is the largest file ReadFile reads (4 MiB): a policy, a
// scenario, or a file one names (a password, a certificate) is far smaller.
const MaxFileSize = 4 << 20

// ReadFile reads the file at path, which must be a regular file of at
// most MaxFileSize bytes. A FIFO, a device or a directory is refused
// without reading it (a FIFO would block the reader for good, /dev/zero
// would fill the memory), and so is a larger file.
func ReadFile(path string) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO waits for a writer otherwise; a regular
	// file reads the same either way.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if m := fi.Mode(); !m.IsRegular() {
		what := "not a regular file"
		switch {
		case m.IsDir():
			what = "is a directory"
		case m&os.ModeNamedPipe != 0:
			what = "is a named pipe (FIFO), not a regular file"
		case m&os.ModeDevice != 0:
			what = "is a device, not a regular file"
		case m&os.ModeSocket != 0:
			what = "is a socket, not a regular file"
		}
		return nil, fmt.Errorf("%s: %s", path, what)
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d a file may have here", path, fi.Size(), MaxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: more than the %d bytes a file may have here", path, MaxFileSize)
	}
	return data, nil
}

// Fields walks a mapping, reporting unknown and duplicate keys, and calls
// visit for each known key with its value node.
func (w *Walker) Fields(n *yaml.Node, path string, known []string, visit func(key string, v *yaml.Node)) map[string]int {
	seen := map[string]int{}
	if n.Kind != yaml.MappingNode {
		where := path
		if where == "" {
			where = "(file)"
		}
		w.Errf(n, where, "want a mapping of fields, got %s", KindName(n))
		return seen
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := Join(path, k.Value)
		if _, dup := seen[k.Value]; dup {
			w.Errf(k, field, "duplicate field")
			continue
		}
		seen[k.Value] = k.Line
		if !slices.Contains(known, k.Value) {
			w.Errf(k, field, "%s", unknownField(k.Value, known))
			continue
		}
		visit(k.Value, v)
	}
	return seen
}

// Closest returns the word of known a typo of at most 2 edits makes word
// (the nearest), or "".
func Closest(word string, known []string) string {
	best, dist := "", 3
	for _, k := range known {
		if d := editDistance(word, k); d < dist {
			best, dist = k, d
		}
	}
	return best
}

// unknownField is the message for key, which is not in known: the known
// keys (all of them when they are few), and the closest one when a typo
// explains the difference (an edit distance of at most 2).
func unknownField(key string, known []string) string {
	best := Closest(key, known)
	msg := "unknown field"
	if best != "" {
		msg += fmt.Sprintf("; did you mean %q?", best)
	}
	if len(known) <= 16 {
		msg += " (known: " + strings.Join(known, ", ") + ")"
	}
	return msg
}

// editDistance is the Levenshtein distance between a and b, in bytes; 3
// (too far for a typo) when either is longer than 256 bytes, so that a
// huge key costs nothing.
func editDistance(a, b string) int {
	if len(a) > 256 || len(b) > 256 {
		return 3
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func Join(path, key string) string {
	if key == "" {
		key = `""`
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", clip(n.Value))
	case yaml.AliasNode:
		return "an alias (YAML anchors and aliases are not supported)"
	}
	return "nothing"
}

func (w *Walker) Str(v *yaml.Node, field string) string {
	if v.Kind != yaml.ScalarNode {
		w.Errf(v, field, "want a string, got %s", KindName(v))
		return ""
	}
	return v.Value
}

func (w *Walker) Integer(v *yaml.Node, field string, lo, hi int64) int64 {
	if v.Kind != yaml.ScalarNode {
		w.Errf(v, field, "want an integer, got %s", KindName(v))
		return 0
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(v.Value, "_", ""), 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		w.Errf(v, field, "%s is out of range [%d, %d]", clip(v.Value), lo, hi)
		return 0
	}
	if err != nil {
		w.Errf(v, field, "%q is not an integer", clip(v.Value))
		return 0
	}
	if n < lo || n > hi {
		w.Errf(v, field, "%d is out of range [%d, %d]", n, lo, hi)
		return 0
	}
	return n
}

func (w *Walker) Boolean(v *yaml.Node, field string) bool {
	switch v.Value {
	case "true":
		return true
	case "false":
		return false
	}
	w.Errf(v, field, "want true or false, got %s", KindName(v))
	return false
}

func (w *Walker) Duration(v *yaml.Node, field string, min time.Duration) time.Duration {
	if v.Kind != yaml.ScalarNode {
		w.Errf(v, field, "want a duration such as 250ms, got %s", KindName(v))
		return 0
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil && !durationSyntax.MatchString(v.Value) {
		w.Errf(v, field, "%q is not a duration (want e.g. 250ms, 5s, 1m)", clip(v.Value))
		return 0
	}
	if err != nil {
		w.Errf(v, field, "%s is out of range (at most about 2562047h)", clip(v.Value))
		return 0
	}
	if d < min {
		w.Errf(v, field, "%v must be at least %v", d, min)
		return 0
	}
	return d
}

func (w *Walker) OneOf(v *yaml.Node, field string, options ...string) string {
	s := w.Str(v, field)
	if s != "" && !slices.Contains(options, s) {
		w.Errf(v, field, "%q is not one of %s", s, strings.Join(options, ", "))
		return ""
	}
	return s
}
