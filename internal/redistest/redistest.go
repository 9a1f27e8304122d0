// Package redistest starts real redis-server processes on free loopback
// ports for tests and benchmarks: one standalone server, or a Cluster of
// masters joined with `redis-cli --cluster create`. Servers can be killed,
// paused (SIGSTOP) and restarted to test failure handling.
//
//	srv := redistest.Start(t) // t.Skip if redis-server is missing, unless SLUICE_REQUIRE_REDIS=1
//	client := newClient(srv.Addr)
package redistest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	Addr    string
	TLSAddr string // StartTLS: the TLS port's address (Addr stays plain TCP)
	CAFile  string // StartTLS: the PEM file of the CA that signed the server's certificate
	port    int
	dir     string
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	t       testing.TB
}

// need skips t when redis-server is not installed, or fails it when the
// environment says Redis is required (CI sets SLUICE_REQUIRE_REDIS=1).
func need(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("SLUICE_REQUIRE_REDIS") == "1" {
				t.Fatalf("%s not found and SLUICE_REQUIRE_REDIS=1", bin)
			}
			t.Skipf("%s not installed", bin)
		}
	}
}

// freePort returns a port that is free now, and whose cluster bus port
// (port + 10000) is free too. Another process may still take it before the
// server binds; start retries with a new port then.
func freePort(t testing.TB) int {
	t.Helper()
	var last error
	for i := range 200 {
		// First the kernel's choice; when that keeps landing where the bus
		// port cannot fit (or is taken), random ports in a range where it
		// can.
		addr := "127.0.0.1:0"
		if i >= 20 {
			addr = "127.0.0.1:" + strconv.Itoa(20000+rand.IntN(35000))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			last = err
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			last = err
			continue
		}
		bus.Close()
		return port
	}
	t.Fatalf("no free port pair (port and port+10000) on 127.0.0.1; last error: %v", last)
	return 0
}

// Start starts a standalone server; it is stopped when t ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	need(t)
	s := &Server{port: freePort(t), dir: t.TempDir(), t: t}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	s.args = append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port), "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no"}, extra...)
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// StartTLS starts a standalone server that also listens for TLS, with a
// certificate for 127.0.0.1 signed by a CA made for it (CAFile), and
// returns it with a client configuration that trusts that CA. Clients
// need not present a certificate.
func StartTLS(t testing.TB, extra ...string) (*Server, *tls.Config) {
	t.Helper()
	need(t)
	dir := t.TempDir()
	pool, err := writeCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	s := Start(t, append([]string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", filepath.Join(dir, "server.pem"),
		"--tls-key-file", filepath.Join(dir, "server.key"), "--tls-ca-cert-file", filepath.Join(dir, "ca.pem"),
		"--tls-auth-clients", "no"}, extra...)...)
	s.TLSAddr, s.CAFile = "127.0.0.1:"+strconv.Itoa(port), filepath.Join(dir, "ca.pem")
	return s, &tls.Config{RootCAs: pool}
}

// writeCerts writes a CA (ca.pem) and a certificate it signs for
// 127.0.0.1 (server.pem, server.key) into dir, and returns a pool holding
// the CA.
func writeCerts(dir string) (*x509.CertPool, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(crand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(crand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	for name, b := range map[string]*pem.Block{"ca.pem": {Type: "CERTIFICATE", Bytes: caDER},
		"server.pem": {Type: "CERTIFICATE", Bytes: der}, "server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, nil
}

// start runs redis-server and waits until it answers. If the process
// exits first (its port was taken meanwhile), it retries on a new port
// unless fixedPort (a restart must keep its address).
func (s *Server) start() { s.startOn(false) }

func (s *Server) startOn(fixedPort bool) {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		s.cmd = exec.Command("redis-server", s.args...)
		s.cmd.Dir = s.dir
		if err := s.cmd.Start(); err != nil {
			s.t.Fatal(err)
		}
		exited := make(chan struct{})
		cmd := s.cmd
		go func() { cmd.Wait(); close(exited) }()
		if s.waitUp(exited) {
			s.exited = exited
			return
		}
		if fixedPort || attempt == 5 {
			s.t.Fatalf("redis-server on %s did not start", s.Addr)
		}
		s.setPort(freePort(s.t))
	}
}

// waitUp reports whether the server answers before it exits or 10 s pass.
func (s *Server) waitUp(exited chan struct{}) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.Addr) == nil {
			return true
		}
		select {
		case <-exited:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}

func (s *Server) setPort(port int) {
	old := strconv.Itoa(s.port)
	s.port = port
	s.Addr = "127.0.0.1:" + strconv.Itoa(port)
	for i, a := range s.args {
		if a == old && i > 0 && s.args[i-1] == "--port" {
			s.args[i] = strconv.Itoa(port)
		}
	}
}

// Kill stops the server at once (SIGKILL); state is lost.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause() { s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume unfreezes a paused server.
func (s *Server) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Restart starts a killed server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.startOn(true)
}

// Do sends one command with redis-cli and returns its output.
func (s *Server) Do(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.port)}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("redis-cli %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Cluster is a Redis Cluster of masters (no replicas).
type Cluster struct {
	Nodes []*Server
	Addrs []string
}

// StartCluster starts n ≥ 3 masters and joins them into a cluster.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	need(t)
	c := &Cluster{}
	for range n {
		port := freePort(t)
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join("nodes-"+strconv.Itoa(port)+".conf"),
			"--cluster-node-timeout", "2000")
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		for !strings.Contains(s.Do("cluster", "info"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				t.Fatal("cluster did not become ok")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") { // up, with a password
		return fmt.Errorf("ping: %q", line)
	}
	return nil
}
