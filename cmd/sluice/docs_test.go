package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shellBlock is one fenced shell block of a Markdown file.
type shellBlock struct {
	file  string
	line  int    // of the opening fence
	note  string // the HTML comment right above it, if any
	lines []string
}

var fence = regexp.MustCompile("^```(sh|bash|shell|console)\\s*$")

// shellBlocks returns the shell blocks of README.md, BENCHMARKS.md and the
// Markdown files under docs/.
func shellBlocks(t *testing.T) []shellBlock {
	t.Helper()
	files, _ := filepath.Glob("../../docs/*.md")
	more, _ := filepath.Glob("../../docs/*/*.md")
	files = append(append([]string{"../../README.md", "../../BENCHMARKS.md"}, files...), more...)
	var out []shellBlock
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			if !fence.MatchString(lines[i]) {
				continue
			}
			b := shellBlock{file: strings.TrimPrefix(f, "../../"), line: i + 1}
			if i > 0 && strings.HasPrefix(strings.TrimSpace(lines[i-1]), "<!--") {
				b.note = strings.TrimSpace(lines[i-1])
			}
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				b.lines = append(b.lines, lines[i])
			}
			out = append(out, b)
		}
	}
	return out
}

var (
	runBy        = regexp.MustCompile(`^<!-- run by (Test\w+)(, (Test\w+))* -->$`)
	illustrative = regexp.MustCompile(`^<!-- illustrative: .{10,} -->$`)
)

// Every shell block in the README, BENCHMARKS and docs/ is either run by a test the
// comment above it names, or marked illustrative with a reason; and every
// sluice command line in any of them names a subcommand and flags the CLI
// has, so a renamed flag cannot rot in a guide.
func TestDocShellBlocks(t *testing.T) {
	tests := testNames(t)
	blocks := shellBlocks(t)
	if len(blocks) < 10 {
		t.Fatalf("found %d shell blocks", len(blocks))
	}
	for _, b := range blocks {
		where := fmt.Sprintf("%s:%d", b.file, b.line)
		switch {
		case runBy.MatchString(b.note):
			for _, name := range regexp.MustCompile(`Test\w+`).FindAllString(b.note, -1) {
				if !tests[name] {
					t.Errorf("%s: run by %s, which is no test", where, name)
				}
			}
		case illustrative.MatchString(b.note):
		default:
			t.Errorf("%s: a shell block with neither <!-- run by TestName --> nor <!-- illustrative: why --> above it", where)
		}
		for _, args := range sluiceLines(b.lines) {
			if err := parsesAsCLI(args); err != nil {
				t.Errorf("%s: sluice %s: %v", where, strings.Join(args, " "), err)
			}
		}
	}
}

// testNames are the test functions of the repository.
func testNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	re := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)
	filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, m := range re.FindAllStringSubmatch(string(data), -1) {
			names[m[1]] = true
		}
		return nil
	})
	return names
}

// sluiceLines returns the arguments of every sluice command line in a
// block (bin/sluice, sluice, go run ./cmd/sluice), continuations joined,
// comments and shell redirections cut.
func sluiceLines(lines []string) [][]string {
	var out [][]string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		for strings.HasSuffix(strings.TrimSpace(l), "\\") && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(strings.TrimSpace(l), "\\") + " " + lines[i]
		}
		words := shellWords(l)
		for j, w := range words {
			var rest []string
			switch {
			case (w == "sluice" || w == "bin/sluice") && (j == 0 || words[j-1] != "-o"):
				rest = words[j+1:]
			case w == "./cmd/sluice" && j >= 2 && words[j-2] == "go" && words[j-1] == "run":
				rest = words[j+1:]
			default:
				continue
			}
			for k, r := range rest {
				if r == "&" || r == "|" || r == ">" || r == "&&" || r == ";" {
					rest = rest[:k]
					break
				}
			}
			if len(rest) > 0 {
				out = append(out, rest)
			}
			break
		}
	}
	return out
}

// shellWords splits a line as a shell would for these guides: words, quotes
// ('…' and "…") kept together, a # comment cut.
func shellWords(l string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '#' && !in:
			return words
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// parsesAsCLI finds the subcommand of args and parses its flags, running
// nothing.
func parsesAsCLI(args []string) error {
	cmd, rest, err := root().Find(args)
	if err != nil {
		return err
	}
	if cmd == cmd.Root() && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("no subcommand %q", args[0])
	}
	return cmd.ParseFlags(rest)
}

// The README's quick start, as a reader runs it: its policy (read from the
// README) checks, and sluice proxy in front of a service answers alice's
// five requests 200 200 200 429 429 as the README says, with the
// rate-limit fields on the 429; the admin API lists the gates and
// switches one to shadow; /metrics counts the requests.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice proxy")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)cat > quick\.yaml <<'YAML'\n(.*?)\nYAML\n`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("no quick.yaml heredoc in the README")
	}
	want := regexp.MustCompile(`# (200 200 200 429 429)`).FindSubmatch(readme)
	if want == nil {
		t.Fatal("the README no longer says what alice gets")
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "quick.yaml")
	if err := os.WriteFile(pol, append(m[1], '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := run("check", pol); err != nil {
		t.Fatalf("sluice check quick.yaml: %v\n%s", err, stderr)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "directory listing") }))
	defer up.Close()
	c := startChild(t, "proxy", "--config", pol, "--upstream", up.URL, "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "s3cret")
	serving := fields(c.waitLine("sluice proxy serving"))
	base, admin := "http://"+serving["listen"], "http://"+serving["admin"]
	get := func(url, key string) *http.Response {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	var codes []string
	var last *http.Response
	for range 5 {
		last = get(base+"/", "alice")
		codes = append(codes, fmt.Sprint(last.StatusCode))
	}
	if got := strings.Join(codes, " "); got != string(want[1]) {
		t.Fatalf("alice got %s, the README says %s", got, want[1])
	}
	for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
		if last.Header.Get(h) == "" {
			t.Errorf("the 429 has no %s", h)
		}
	}
	if code := get(base+"/", "bob").StatusCode; code != 200 {
		t.Errorf("bob got %d: his burst is his own", code)
	}
	req, _ := http.NewRequest("GET", admin+"/v1/gates", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var gates []map[string]any
	json.NewDecoder(resp.Body).Decode(&gates)
	resp.Body.Close()
	if len(gates) != 2 {
		t.Errorf("/v1/gates: %v", gates)
	}
	req, _ = http.NewRequest("POST", admin+"/v1/gates/per-tenant", strings.NewReader(`{"mode":"shadow"}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("switching per-tenant to shadow: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := get(base+"/", "alice").StatusCode; code != 200 {
		t.Errorf("alice got %d with per-tenant in shadow", code)
	}
	resp, err = http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "sluice_requests") {
		t.Error("/metrics has no sluice_requests series")
	}
	c.stop()
}
