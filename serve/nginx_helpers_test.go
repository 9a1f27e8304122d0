package serve

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The example's addresses, which the tests replace with their own.
const (
	exampleListen = "127.0.0.1:8000"
	exampleSluice = "127.0.0.1:8080"
	exampleApp    = "127.0.0.1:9000"
)

// nginxBinary returns the nginx command, or skips t when there is none
// (fails it when SLUICE_REQUIRE_NGINX=1, as in CI).
func nginxBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("nginx")
	if err != nil {
		for _, c := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"} {
			if _, e := os.Stat(c); e == nil {
				return c
			}
		}
		if os.Getenv("SLUICE_REQUIRE_NGINX") == "1" {
			t.Fatal("SLUICE_REQUIRE_NGINX=1 and no nginx found")
		}
		t.Skip("nginx not installed (apt-get install nginx-light; SLUICE_REQUIRE_NGINX=1 makes this a failure)")
	}
	return p
}

// nginx is an nginx process serving a generated configuration from its
// own temporary prefix, in the foreground and as a single process, so
// that stopping it leaves nothing behind.
type nginx struct {
	t    testing.TB
	cmd  *exec.Cmd
	dir  string
	addr string // host:port nginx listens on
	out  bytes.Buffer
	// exited is closed when the process has exited, with waitErr set.
	exited  chan struct{}
	waitErr error
	once    sync.Once
}

// startNginx runs nginx with the server blocks of site (the text of
// examples/nginx/sluice.conf, say) inside a generated http block, with the
// example's sluice and application addresses replaced by sluiceAddr and
// appAddr and its listen address by a free loopback port (site must name
// the listen and application addresses). extraHTTP is
// added to the http block. It is stopped when t ends.
func startNginx(t testing.TB, site, sluiceAddr, appAddr, extraHTTP string) *nginx {
	t.Helper()
	bin := nginxBinary(t)
	for _, a := range []string{exampleListen, exampleApp} {
		if !strings.Contains(site, a) {
			t.Fatalf("the nginx site has no %s to replace", a)
		}
	}
	var last error
	for range 3 { // a free port may be taken between choosing it and nginx binding it
		n, err := tryNginx(t, bin, site, sluiceAddr, appAddr, extraHTTP)
		if err == nil {
			t.Cleanup(n.stop)
			return n
		}
		last = err
	}
	t.Fatal(last)
	return nil
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tryNginx(t testing.TB, bin, site, sluiceAddr, appAddr, extraHTTP string) (*nginx, error) {
	dir := t.TempDir()
	n := &nginx{t: t, dir: dir, addr: freePort(t), exited: make(chan struct{})}
	site = strings.NewReplacer(exampleListen, n.addr, exampleSluice, sluiceAddr, exampleApp, appAddr).Replace(site)
	main := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    %[2]s
    include %[1]s/site.conf;
}
`, dir, extraHTTP)
	if err := os.WriteFile(filepath.Join(dir, "site.conf"), []byte(site), 0o644); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(main), 0o644); err != nil {
		return nil, err
	}
	n.cmd = exec.Command(bin, "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log"))
	n.cmd.Stdout, n.cmd.Stderr = &n.out, &n.out
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { n.waitErr = n.cmd.Wait(); close(n.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", n.addr, time.Second)
		if err == nil {
			c.Close()
			return n, nil
		}
		select {
		case <-n.exited:
			return nil, fmt.Errorf("nginx exited before serving (%v): %s%s", n.waitErr, n.out.String(), n.errorLog())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop()
			return nil, errors.New("nginx did not listen within 20 s: " + n.errorLog())
		}
	}
}

// errorLog returns nginx's error log.
func (n *nginx) errorLog() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "error.log"))
	return string(b)
}

// stop asks nginx to finish gracefully (SIGQUIT), kills it after 10 s,
// and waits for it to exit.
func (n *nginx) stop() {
	n.once.Do(func() {
		select {
		case <-n.exited:
			return
		default:
		}
		n.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-n.exited:
		case <-time.After(10 * time.Second):
			n.cmd.Process.Kill()
			<-n.exited
			n.t.Errorf("nginx did not stop on SIGQUIT within 10 s; killed")
		}
	})
}
