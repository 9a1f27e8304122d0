package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/redistest"
)

// authPolicy is a policy on the Redis at addr with store keys extra.
func authPolicy(addr, extra string) string {
	return "version: 1\nstore:\n  backend: redis\n  addrs: [" + addr + "]\n  timeout: 1s\n" + extra +
		"gates:\n  - {name: rate, kind: token_bucket, scope: service, rate: 1/h, burst: 10}\n"
}

// buildsAndDecides parses and builds src (at path) and reports the error,
// or fails t if the built policy does not decide on Redis: the bucket of
// 10 there has left tokens after this decision.
func buildsAndDecides(t *testing.T, path, src string, prev *Runtime, left int64) (*Runtime, error) {
	t.Helper()
	f, err := Parse(path, []byte(src))
	if err != nil {
		return nil, err
	}
	rt, err := Build(f, prev, Options{})
	if err != nil {
		return nil, err
	}
	t.Cleanup(rt.Close)
	d, tk := rt.Chain.Decide(context.Background(), &sluice.Request{})
	if !d.Admitted || d.Remaining != left {
		t.Fatalf("%s: decision %+v, want admitted with %d left (on Redis)", path, d, left)
	}
	tk.Done(sluice.OutcomeUseful)
	return rt, nil
}

// fieldOf returns the file, line and field of err, a policy error.
func fieldOf(err error) (string, int, string) {
	var es Errors
	if asErrors(err, &es) && len(es) == 1 {
		return es[0].File, es[0].Line, es[0].Field
	}
	if e, ok := err.(*Error); ok {
		return e.File, e.Line, e.Field
	}
	return "", 0, ""
}

// A policy file names the Redis password by an environment variable or a
// file (never the password itself), a user, and TLS with the CA's file.
// Each mistake is an error naming the file, the line and the field,
// Redis' refusal included (a wrong password used to start the store as
// unreachable: every gate on its failure policy, with no word of why).
func TestRedisCredentialsAndTLSFromThePolicyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	t.Run("password", func(t *testing.T) {
		srv := redistest.Start(t, "--requirepass", "s3cret")
		t.Setenv("SLUICE_TEST_REDIS_PW", "s3cret")
		if _, err := buildsAndDecides(t, path, authPolicy(srv.Addr, "  password_env: SLUICE_TEST_REDIS_PW\n"), nil, 9); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "pw"), []byte("s3cret\n"), 0o600) // a final newline, as editors write
		if _, err := buildsAndDecides(t, path, authPolicy(srv.Addr, "  password_file: pw\n"), nil, 8); err != nil {
			t.Fatal(err)
		}
		t.Setenv("SLUICE_TEST_REDIS_PW", "wrong")
		_, err := buildsAndDecides(t, path, authPolicy(srv.Addr, "  password_env: SLUICE_TEST_REDIS_PW\n"), nil, 0)
		if file, line, field := fieldOf(err); file != path || line != 6 || field != "store.password_env" || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("a wrong password: %v (%s:%d %s)", err, file, line, field)
		}
		_, err = buildsAndDecides(t, path, authPolicy(srv.Addr, ""), nil, 0)
		if !strings.Contains(err.Error(), "NOAUTH") || !strings.Contains(err.Error(), "set store.password_env or store.password_file") {
			t.Errorf("no password: %v", err)
		}
	})
	t.Run("user", func(t *testing.T) {
		srv := redistest.Start(t, "--user", "sluice", "on", ">pw", "~*", "&*", "+@all", "--user", "other", "on", ">pw", "~other:*", "&*", "+@all")
		t.Setenv("SLUICE_TEST_REDIS_PW", "pw")
		if _, err := buildsAndDecides(t, path, authPolicy(srv.Addr, "  username: sluice\n  password_env: SLUICE_TEST_REDIS_PW\n"), nil, 9); err != nil {
			t.Fatal(err)
		}
		// The right password, a user whose keys are others': the user's
		// field, not the password's.
		_, err := buildsAndDecides(t, path, authPolicy(srv.Addr, "  username: other\n  password_env: SLUICE_TEST_REDIS_PW\n"), nil, 0)
		if _, line, field := fieldOf(err); line != 6 || field != "store.username" || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("a user without the rights: %v (line %d, %s)", err, line, field)
		}
	})
	t.Run("client certificate required", func(t *testing.T) {
		srv, _ := redistest.StartTLS(t, "--tls-auth-clients", "yes")
		_, err := buildsAndDecides(t, path, authPolicy(srv.TLSAddr, "  tls: {ca_file: "+srv.CAFile+"}\n"), nil, 0)
		if _, line, field := fieldOf(err); line != 6 || field != "store.tls" || !strings.Contains(err.Error(), "tls.cert_file and tls.key_file") {
			t.Errorf("no client certificate: %v (line %d, %s)", err, line, field)
		}
	})
	t.Run("tls", func(t *testing.T) {
		srv, _ := redistest.StartTLS(t)
		if _, err := buildsAndDecides(t, path, authPolicy(srv.TLSAddr, "  tls: {ca_file: "+srv.CAFile+"}\n"), nil, 9); err != nil {
			t.Fatal(err)
		}
		_, err := buildsAndDecides(t, path, authPolicy(srv.TLSAddr, "  tls: {}\n"), nil, 0)
		if _, line, field := fieldOf(err); line != 6 || field != "store.tls" || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a certificate the system's roots do not verify: %v (line %d, %s)", err, line, field)
		}
	})
	t.Run("mistakes", func(t *testing.T) {
		os.Unsetenv("SLUICE_TEST_REDIS_UNSET")
		os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600)
		os.WriteFile(filepath.Join(dir, "not.pem"), []byte("hello"), 0o600)
		os.WriteFile(filepath.Join(dir, "pw"), []byte("s3cret\n"), 0o600) // also when the subtests with a server skip
		for _, c := range []struct {
			extra, field, msg string
		}{
			{"  password_env: SLUICE_TEST_REDIS_UNSET\n", "store.password_env", "not set"},
			{"  password_file: missing\n", "store.password_file", "no such file"},
			{"  password_file: empty\n", "store.password_file", "empty"},
			{"  password_env: HOME\n  password_file: pw\n", "store.password_file", "one of them"},
			{"  username: sluice\n", "store.username", "needs its password"},
			{"  tls: {ca_file: not.pem}\n", "store.tls.ca_file", "no PEM certificate"},
			{"  tls: {cert_file: not.pem}\n", "store.tls.key_file", "both cert_file and key_file"},
			{"  tls: {cert_file: not.pem, key_file: not.pem}\n", "store.tls.cert_file", "with key_file"},
			{"  tls: true\n", "store.tls", ""},
			{"  tls: {ca: x}\n", "store.tls.ca", ""},
		} {
			_, err := Parse(path, []byte(authPolicy("127.0.0.1:1", c.extra)))
			if file, _, field := fieldOf(err); file != path || field != c.field || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%q: %v (field %s)", c.extra, err, field)
			}
		}
		mem := "version: 1\nstore: {backend: memory, password_env: HOME}\ngates: [{name: c, kind: concurrency, limit: 1}]\n"
		if _, _, field := fieldOf(must(Parse(path, []byte(mem)))); field != "store.password_env" {
			t.Errorf("a password on the memory store: field %q", field)
		}
	})
}

// A reload that rotates the password (a new password file, SIGHUP) opens
// a connection with the new one; one that changes nothing of the
// connection keeps it.
func TestReloadTakesARotatedPassword(t *testing.T) {
	dir := t.TempDir()
	path, pw := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "pw")
	srv := redistest.Start(t, "--user", "a", "on", ">one", "~*", "&*", "+@all")
	os.WriteFile(pw, []byte("one"), 0o600)
	src := authPolicy(srv.Addr, "  username: a\n  password_file: pw\n")
	first, err := buildsAndDecides(t, path, src, nil, 9)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do("ACL", "SETUSER", "a", ">two") // Redis takes the new password beside the old
	os.WriteFile(pw, []byte("two"), 0o600)
	second, err := buildsAndDecides(t, path, src, first, 8)
	if err != nil {
		t.Fatal(err)
	}
	if second.redis.conn == first.redis.conn {
		t.Fatal("the rotated password kept the old connection's identity")
	}
	srv.Do("ACL", "SETUSER", "a", "<one") // the old password is gone
	third, err := buildsAndDecides(t, path, src, second, 7)
	if err != nil {
		t.Fatalf("a reload after the old password was removed: %v", err)
	}
	if third.redis != second.redis {
		t.Error("a reload that changed nothing of the store did not keep it")
	}
}

// must returns err (a test of errors wants the error, not the file).
func must(_ *File, err error) error { return err }
