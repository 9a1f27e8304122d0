package serve

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/internal/logbuf"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// /readyz is 200 while serving and 503 from the moment the drain starts,
// /healthz 200 until the admin listener closes, /metrics carries the build
// information; Unready turns readiness off ahead of Run's end.
func TestReadinessAndBuildInfo(t *testing.T) {
	grace := make(chan time.Time)
	asked := make(chan time.Duration, 1)
	log := &logbuf.Buffer{}
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(ratePolicy), HTTP: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(log, nil)), DrainGrace: 2 * time.Second,
		DrainAfter: func(d time.Duration) <-chan time.Time { asked <- d; return grace }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	hp, a := s.Addrs()
	admin := "http://" + a.String()
	if c, body := get(t, admin+"/readyz"); c != 200 || body != "ready\n" {
		t.Fatalf("/readyz serving: %d %q", c, body)
	}
	if _, body := get(t, admin+"/metrics"); !strings.Contains(body, "sluice_build_info{goversion=\"go") {
		t.Fatalf("no sluice_build_info in /metrics:\n%.2000s", body)
	}
	// A request half sent holds its connection active: the drain waits
	// for it until the grace runs out.
	c, err := net.Dial("tcp", hp.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET "+DecidePath+" HTTP/1.1\r\nHost: x\r\n")
	if code, _ := get(t, admin+"/readyz"); code != 200 {
		t.Fatal(code)
	}
	s.Unready()
	if c, body := get(t, admin+"/readyz"); c != 503 || body != "draining\n" {
		t.Fatalf("/readyz after Unready: %d %q", c, body)
	}
	cancel()
	if d := <-asked; d != 2*time.Second {
		t.Fatalf("grace %v", d)
	}
	if c, _ := get(t, admin+"/healthz"); c != 200 {
		t.Fatalf("/healthz while draining: %d", c)
	}
	close(grace)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The connection is closed; no decision was running, none is counted.
	if n := testutil.ToFloat64(s.host.DrainCut().WithLabelValues("serve")); n != 0 {
		t.Fatalf("%v cut with no decision in flight", n)
	}
	if !strings.Contains(log.String(), "drain grace ran out") {
		t.Fatalf("the closed connection is not logged:\n%s", log.String())
	}
}
