package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// decides reports whether a store on opts decides on Redis: a take of a
// fresh bucket is allowed. It fails t when New refuses opts.
func decides(t *testing.T, opts Options) bool {
	t.Helper()
	st, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("auth", must(limit.NewTokenBucket(limit.PerSecond(10), 10))))
	r, _, err := lim.Take(context.Background(), "k", 0, 1, 0)
	return err == nil && r.OK()
}

// refused returns New's error for opts, failing t if New accepted them.
func refused(t *testing.T, opts Options) string {
	t.Helper()
	st, err := New(opts)
	if err == nil {
		st.Close()
		t.Fatalf("New accepted %+v", opts)
	}
	return err.Error()
}

// A store authenticates with a password (the default user's requirepass)
// or a user and its password (an ACL user), and secures its connections
// with TLS, verifying the server's certificate. Settings Redis refuses
// (a wrong or missing password, a certificate that does not verify) are
// New's error, naming the cause: no probe would ever
// reach Redis with them, and a store that started "unreachable" would
// send every gate to its failure policy for good, with the reason lost.
func TestPasswordUserAndTLS(t *testing.T) {
	t.Run("password", func(t *testing.T) {
		srv := redistest.Start(t, "--requirepass", "s3cret")
		if !decides(t, Options{Addrs: []string{srv.Addr}, Password: "s3cret", Timeout: time.Second}) {
			t.Fatal("no decision with the password")
		}
		if msg := refused(t, Options{Addrs: []string{srv.Addr}, Password: "wrong"}); !strings.Contains(msg, "WRONGPASS") {
			t.Errorf("a wrong password: %s", msg)
		}
		if msg := refused(t, Options{Addrs: []string{srv.Addr}}); !strings.Contains(msg, "NOAUTH") {
			t.Errorf("no password: %s", msg)
		}
	})
	t.Run("user", func(t *testing.T) {
		srv := redistest.Start(t, "--user", "sluice", "on", ">pw", "~*", "&*", "+@all")
		if !decides(t, Options{Addrs: []string{srv.Addr}, Username: "sluice", Password: "pw", Timeout: time.Second}) {
			t.Fatal("no decision as the user")
		}
		if msg := refused(t, Options{Addrs: []string{srv.Addr}, Username: "sluice", Password: "nope"}); !strings.Contains(msg, "WRONGPASS") {
			t.Errorf("a wrong password: %s", msg)
		}
	})
	t.Run("tls", func(t *testing.T) {
		srv, trust := redistest.StartTLS(t)
		if !decides(t, Options{Addrs: []string{srv.TLSAddr}, TLS: trust, Timeout: time.Second}) {
			t.Fatal("no decision over TLS")
		}
		if msg := refused(t, Options{Addrs: []string{srv.TLSAddr}, TLS: &tls.Config{}}); !strings.Contains(msg, "certificate") {
			t.Errorf("a certificate the system's roots do not verify: %s", msg)
		}
		// A plain store sent to the TLS port reads a reset: refused, saying
		// the server speaks TLS.
		if msg := refused(t, Options{Addrs: []string{srv.TLSAddr}}); !strings.Contains(msg, "speaks TLS") {
			t.Errorf("no TLS settings for a TLS server: %s", msg)
		}
	})
}

// Share opens a connection of its own for other credentials or another
// TLS configuration: a reload that changes the password must not go on
// deciding on the connection the old one opened.
func TestShareKeepsTheConnectionOnlyForTheSameCredentials(t *testing.T) {
	srv := redistest.Start(t, "--user", "a", "on", ">pa", "~*", "&*", "+@all", "--user", "b", "on", ">pb", "~*", "&*", "+@all")
	st, err := New(Options{Addrs: []string{srv.Addr}, Username: "a", Password: "pa"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	same, err := st.Share(Options{Addrs: []string{srv.Addr}, Username: "a", Password: "pa", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if same.conn.Load() != st.conn.Load() {
		t.Error("the same credentials opened a new connection")
	}
	if _, err := st.Share(Options{Addrs: []string{srv.Addr}, Username: "b", Password: "wrong"}); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("other credentials shared the connection, or were not checked: %v", err)
	}
	other, err := st.Share(Options{Addrs: []string{srv.Addr}, Username: "b", Password: "pb"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.conn.Load() == st.conn.Load() {
		t.Error("other credentials shared the connection")
	}
}

// What the ACL of the store's user must allow (scripts, on the keys of the
// store's prefix, reading TIME) is checked at New: a user without it is
// refused with Redis' NOPERM, not started to fail every decision.
func TestUserWithoutTheRightsIsRefused(t *testing.T) {
	args := []string{"--user", "keys", "on", ">pw", "~other:*", "&*", "+@all"}
	denied := map[string]string{"noeval": "", "noevalsha": "", "notime": "TIME", "noset": "SET", "nozadd": "ZADD", "nohash": "HSET HGET"}
	for user, cmds := range map[string]string{"noeval": "-eval", "noevalsha": "-evalsha", "notime": "-time", "noset": "-set",
		"nozadd": "-zadd", "nohash": "-hset -hget"} {
		args = append(append(args, "--user", user, "on", ">pw", "~*", "&*", "+@all"), strings.Fields(cmds)...)
	}
	srv := redistest.Start(t, args...)
	for _, user := range []string{"keys", "noeval", "noevalsha", "notime", "noset", "nozadd", "nohash"} {
		msg := refused(t, Options{Addrs: []string{srv.Addr}, Username: user, Password: "pw"})
		if !strings.Contains(msg, "NOPERM") || !strings.Contains(msg, "refused") || !strings.Contains(msg, denied[user]) {
			t.Errorf("user %s: %s", user, msg)
		}
	}
	if !decides(t, Options{Addrs: []string{srv.Addr}, Username: "keys", Password: "pw", Prefix: "other", Timeout: time.Second}) {
		t.Error("no decision under the prefix the user may use")
	}
	st, err := New(Options{Addrs: []string{srv.Addr}, Username: "keys", Password: "pw", Prefix: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Share(Options{Addrs: []string{srv.Addr}, Username: "keys", Password: "pw", Prefix: "sluice"}); !errors.Is(err, ErrRefused) {
		t.Errorf("a shared connection under a prefix the user may not use: %v", err)
	}
}

// A TLS server that requires a client certificate refuses a store that
// has none: New's error, with the server's alert.
func TestTLSClientCertificateRequired(t *testing.T) {
	srv, trust := redistest.StartTLS(t, "--tls-auth-clients", "yes")
	msg := refused(t, Options{Addrs: []string{srv.TLSAddr}, TLS: trust})
	t.Log(msg)
	if !strings.Contains(msg, "refused") || !strings.Contains(msg, "certificate") {
		t.Errorf("no client certificate: %s", msg)
	}
}

// Once started, a store whose Redis begins refusing it (a password set,
// the connections ended) says so in the error of each decision the open
// breaker fails fast, not only "unavailable": the gates log that error.
func TestRefusalAfterStartIsTheDecisionsError(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second, ProbeEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("auth", must(limit.NewTokenBucket(limit.PerSecond(10), 10))))
	if _, _, err := lim.Take(context.Background(), "k", 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	srv.Do("CONFIG", "SET", "requirepass", "now")
	srv.Do("-a", "now", "--no-auth-warning", "CLIENT", "KILL", "TYPE", "normal")
	var last error
	poll.Until(t, 10*time.Second, func() bool {
		_, _, last = lim.Take(context.Background(), "k", 0, 1, 0)
		return errors.Is(last, ErrRefused)
	})
	if !errors.Is(last, store.ErrUnavailable) || !strings.Contains(last.Error(), "NOAUTH") {
		t.Errorf("the decision's error: %v", last)
	}
}

// A user who may not PING or SCRIPT LOAD has what the calls need (EVALSHA,
// EVAL when Redis lost the script): New takes it, and its store recovers
// from a Redis restart (the probe loads no script, the calls send EVAL) and
// does not open its breaker on one slow call (the check's PING is denied,
// and answered).
func TestUserWithoutPingOrScriptLoadRecovers(t *testing.T) {
	srv := redistest.Start(t, "--user", "u", "on", ">pw", "~*", "&*", "+@all", "-ping", "-script|load")
	st, err := New(Options{Addrs: []string{srv.Addr}, Username: "u", Password: "pw", Timeout: 100 * time.Millisecond,
		ProbeEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("acl", must(limit.NewTokenBucket(limit.PerSecond(1), 100))))
	take := func() error {
		_, _, err := lim.Take(context.Background(), "k", 0, 1, 0)
		return err
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	srv.Do("CLIENT", "PAUSE", "300")
	take() // times out: the check that follows is a PING, denied, and answered
	time.Sleep(400 * time.Millisecond)
	if st.breaker.open.Load() {
		t.Error("the breaker opened on one slow call: the denied PING was taken for a dead Redis")
	}
	srv.Restart()
	srv.Do("ACL", "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all", "-ping", "-script|load")
	poll.Until(t, 10*time.Second, func() bool { return take() == nil })
}

// What New could not check because Redis was away is checked by the first
// probe that reaches it: a user without the rights is then refused (the
// breaker stays open, its cause Redis' refusal), not left to fail every
// decision behind a closed breaker.
func TestRightsCheckedOnceRedisIsBack(t *testing.T) {
	srv := redistest.Start(t, "--user", "notime", "on", ">pw", "~*", "&*", "+@all", "-time")
	addr := srv.Addr
	srv.Kill()
	st, err := New(Options{Addrs: []string{addr}, Username: "notime", Password: "pw", Timeout: time.Second, ProbeEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with Redis away: %v", err)
	}
	defer st.Close()
	srv.Restart()
	srv.Do("ACL", "SETUSER", "notime", "on", ">pw", "~*", "&*", "+@all", "-time")
	lim, _ := bind(st)(tokenBucketSpec("acl", must(limit.NewTokenBucket(limit.PerSecond(10), 10))))
	var last error
	poll.Until(t, 10*time.Second, func() bool {
		_, _, last = lim.Take(context.Background(), "k", 0, 1, 0)
		return errors.Is(last, ErrRefused)
	})
	if RefusalOf(last) != Permissions || !strings.Contains(last.Error(), "TIME") {
		t.Errorf("the decision's error: %v (%v)", last, RefusalOf(last))
	}
}

// A user who may run EVALSHA but not EVAL is refused even when Redis holds
// the check's script already (another store ran it): the clock read is
// sent as EVAL.
func TestUserWithoutEvalRefusedWhenTheScriptIsCached(t *testing.T) {
	srv := redistest.Start(t, "--user", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval")
	ok, err := New(Options{Addrs: []string{srv.Addr}}) // the default user: runs the check, caching its script
	if err != nil {
		t.Fatal(err)
	}
	ok.Close()
	if msg := refused(t, Options{Addrs: []string{srv.Addr}, Username: "noeval", Password: "pw"}); !strings.Contains(msg, "eval") {
		t.Errorf("a user without EVAL: %s", msg)
	}
}

// A read-only replica's address is refused at New: every decision writes.
func TestReplicaRefused(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	replica.Do("REPLICAOF", host, port)
	msg := refused(t, Options{Addrs: []string{replica.Addr}, Timeout: time.Second})
	if !strings.Contains(msg, "replica") {
		t.Errorf("a replica: %s", msg)
	}
}

// A standalone server given among several addresses (which makes the
// client speak Redis Cluster) is refused at New with Redis' answer: it
// started, and every decision failed for as long as the process ran.
func TestStandaloneGivenAsAClusterRefused(t *testing.T) {
	srv := redistest.Start(t)
	msg := refused(t, Options{Addrs: []string{srv.Addr, "127.0.0.1:1"}, Timeout: time.Second})
	if !strings.Contains(msg, "cluster support disabled") {
		t.Errorf("a standalone server given as a cluster: %s", msg)
	}
	if RefusalOf(errors.New(msg)) != NotRefused { // only Redis' own answer is one
		t.Error("a plain error read as a refusal")
	}
}
