package host

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/redistest"
)

// The operator's reload (SIGHUP) reads the files the policy names again
// even when the policy file did not change: a rotated password file is
// taken, and a reload refused for a wrong password is tried again once
// the file is fixed. Before, an unchanged policy file was "unchanged"
// whatever its secret files held, and a refused one stayed refused.
func TestReloadRereadsThePasswordFile(t *testing.T) {
	srv := redistest.Start(t, "--user", "a", "on", ">one", "~*", "&*", "+@all")
	dir := t.TempDir()
	path, pw := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("one\n"), 0o600)
	os.WriteFile(path, []byte("version: 1\nstore: {backend: redis, addrs: ["+srv.Addr+"], timeout: 1s, username: a, password_file: pw}\n"+
		"gates:\n  - {name: rate, kind: token_bucket, scope: service, rate: 1/h, burst: 10}\n"), 0o600)
	h, err := New(Options{Config: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	decides := func(left int64) {
		t.Helper()
		d, tk := h.Chain().Decide(context.Background(), &sluice.Request{})
		if !d.Admitted || d.Remaining != left {
			t.Fatalf("decision %+v, want admitted on Redis with %d left", d, left)
		}
		tk.Done(sluice.OutcomeUseful)
	}
	decides(9)
	if changed, err := h.Reload(); changed || err != nil {
		t.Fatalf("a reload with nothing changed: %v %v", changed, err)
	}
	v := h.Version()
	os.WriteFile(pw, []byte("wrong\n"), 0o600)
	if changed, err := h.Reload(); changed || err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("a reload with a wrong password: %v %v", changed, err)
	}
	srv.Do("ACL", "SETUSER", "a", ">two", "<one") // the password rotated on Redis
	os.WriteFile(pw, []byte("two\n"), 0o600)
	if changed, err := h.Reload(); !changed || err != nil {
		t.Fatalf("a reload of the rotated password file: %v %v", changed, err)
	}
	if h.Version() != v || v != digest(mustRead(t, path)) {
		t.Error("the version is not the policy file's digest alone: it would tell of the password file")
	}
	decides(8)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A given admin token loses the white space around it (a newline of the
// file it came from, which no client's Authorization value keeps) and is
// refused with white space or a control character inside.
func TestAdminTokenTrimmed(t *testing.T) {
	for _, c := range []struct{ give, want, err string }{
		{"s3cret\n", "s3cret", ""},
		{"  s3cret ", "s3cret", ""},
		{"s3 cret", "", "white space or a control character at byte 2"},
		{"s3\x00cret", "", "at byte 2"},
	} {
		got, file, err := AdminToken("proxy", "127.0.0.1:9901", c.give, nil)
		if got != c.want || file != "" || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q: %q, %q, %v; want %q, error %q", c.give, got, file, err, c.want, c.err)
		}
	}
}
