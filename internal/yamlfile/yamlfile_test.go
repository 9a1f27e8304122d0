package yamlfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"
)

// ReadFile reads a regular file and refuses, without blocking or reading
// it whole, anything else: a FIFO (os.ReadFile blocked until a writer
// came, holding a reload's lock), a device (/dev/zero ran out of memory),
// a directory, a file beyond MaxFileSize.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "p.yaml")
	os.WriteFile(ok, []byte("version: 1\n"), 0o644)
	if b, err := ReadFile(ok); err != nil || string(b) != "version: 1\n" {
		t.Fatalf("%q, %v", b, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, MaxFileSize+1), 0o644)
	for path, want := range map[string]string{
		fifo:                         "named pipe",
		"/dev/zero":                  "device",
		dir:                          "directory",
		big:                          "more than",
		filepath.Join(dir, "absent"): "no such file",
	} {
		if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", path, err, want)
		}
	}
}

// A message quoting a huge value is cut (a gate name of 10 MB gave a
// 10 MB error line, logged again on every refused reload).
func TestErrfClips(t *testing.T) {
	w := &Walker{File: "p.yaml"}
	w.Errf(&yaml.Node{Line: 3}, "gates[0].name", "%q: bad name", strings.Repeat("é", 1<<20))
	msg := w.Errs[0].Error()
	if len(msg) > maxMsg+100 || !strings.HasSuffix(w.Errs[0].Msg, "...") || !strings.HasPrefix(msg, "p.yaml:3: gates[0].name: ") {
		t.Fatalf("%d bytes: %.80s", len(msg), msg)
	}
}
