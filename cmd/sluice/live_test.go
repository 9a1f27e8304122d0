package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/proxy"
)

// chromium returns the Chromium binary, skipping t when there is none
// unless SLUICE_REQUIRE_CHROMIUM=1 (CI installs Debian's chromium).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SLUICE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium is not installed and SLUICE_REQUIRE_CHROMIUM=1")
	}
	t.Skip("chromium is not installed (apt-get install chromium; SLUICE_REQUIRE_CHROMIUM=1 makes this a failure)")
	return ""
}

const livePolicy = `version: 1
service: live-test
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: "/reports/*"}, class: sheddable}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 20/s, burst: 20}
  - {name: ladder, kind: ladder, workers: 64}
  - {name: pool, kind: concurrency, limit: 32, queue: {max_wait: 50ms}}
`

// load sends requests of one tenant, one after another, until ctx is done,
// and counts the answers by status.
type load struct {
	tenant, path string
	pause        time.Duration
	ok, rejected atomic.Int64
}

func (l *load) run(ctx context.Context, base string) {
	client := &http.Client{Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+l.path, nil)
		req.Header.Set("X-Api-Key", l.tenant)
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				l.ok.Add(1)
			} else {
				l.rejected.Add(1)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(l.pause):
		}
	}
}

// scrape reads /metrics into series name{labels} → value.
func scrape(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// sum adds the series of name whose labels include every pair of want.
func sum(series map[string]float64, name string, want ...string) int64 {
	var n float64
	for k, v := range series {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		match := true
		for _, w := range want {
			if !strings.Contains(k, w) {
				match = false
			}
		}
		if match {
			n += v
		}
	}
	return int64(n)
}

// pageNumbers is what the page shows, read from its tables as text.
type pageNumbers struct {
	Polls   int                          `json:"polls"`
	Classes map[string]map[string]string `json:"classes"`
	Tenants map[string]map[string]string `json:"tenants"`
	Totals  map[string]string            `json:"totals"`
	Gates   map[string]map[string]string `json:"gates"`
}

const readPage = `(() => {
  const cells = (tr) => Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map((td) => [td.dataset.field, td.textContent]));
  const rows = (sel, key) => Object.fromEntries([...document.querySelectorAll(sel)].map((tr) => [tr.dataset[key], cells(tr)]));
  return {
    polls: Number(document.body.dataset.polls),
    classes: rows('#classes tbody tr', 'class'),
    tenants: rows('#top-rejected tbody tr', 'tenant'),
    totals: Object.fromEntries([...document.querySelectorAll('#totals [data-field]')].map((e) => [e.dataset.field, e.textContent])),
    gates: rows('#gates tbody tr', 'gate'),
  };
})()`

// number parses a count as the page prints it ("12,345").
func number(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("the page shows %q where a count should be", s)
	}
	return n
}

// TestLivePageInChromium runs the proxy under load with a noisy tenant,
// opens the live page in headless Chromium, checks the numbers it shows
// against /metrics scraped just before and just after the page's reading
// (the tolerance is the traffic between the two scrapes: the page must
// lie between them), switches a gate to shadow through the page, keeps a
// screenshot (live.png in the test's artifact directory: go test
// -artifacts keeps it), and tries a wrong token.
func TestLivePageInChromium(t *testing.T) {
	bin := chromium(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	s, err := proxy.New(proxy.Options{ConfigData: []byte(livePolicy), Config: "live.yaml", Upstream: u,
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "live-secret",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pa, aa := s.Addrs()
	base, admin := "http://"+pa.String(), "http://"+aa.String()

	loads := []*load{
		{tenant: "sk_noisy", path: "/routes/1", pause: time.Millisecond},         // far over 20/s: mostly rejected
		{tenant: "sk_calm", path: "/routes/2", pause: 100 * time.Millisecond},    // under its rate
		{tenant: "sk_reports", path: "/reports/3", pause: 60 * time.Millisecond}, // another class
	}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range loads {
		wg.Go(func() { l.run(lctx, base) })
	}
	defer func() { stopLoad(); wg.Wait() }()
	for loads[0].rejected.Load() < 50 || loads[1].ok.Load() < 10 || loads[2].ok.Load() < 10 {
		time.Sleep(20 * time.Millisecond) // until every tenant has a label in /metrics and the noisy one is rejected
	}

	cctx, cancel := browser(t, bin)
	defer cancel()
	var requested []string
	var exceptions []string
	var mu sync.Mutex
	if err := chromedp.Listen(cctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			requested = append(requested, ev.Request.URL)
		case *runtime.EventExceptionThrown:
			exceptions = append(exceptions, fmt.Sprintf("%s:%d: %s", ev.ExceptionDetails.URL, ev.ExceptionDetails.LineNumber, ev.ExceptionDetails.Text))
		}
	}); err != nil {
		t.Fatal(err)
	}
	polls := func() int {
		n, err := chromedp.Run(cctx, chromedp.Evaluate[int](`Number(document.body.dataset.polls)`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := chromedp.Do(cctx, chromedp.EmulateViewport(1440, 1400), chromedp.Navigate(admin+"/")); err != nil {
		t.Fatal(err)
	}
	waitPolls := func(n int) {
		for polls() < n {
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitPolls(8) // rates need two readings; the plots some more

	// Scrape, wait for a reading the page began after the scrape (the
	// second poll from now: the first may have been in flight), read the
	// page, scrape again.
	before := scrape(t, admin)
	for n := polls(); polls() < n+2; {
		time.Sleep(50 * time.Millisecond)
	}
	page, err := chromedp.Run(cctx, chromedp.Evaluate[pageNumbers](readPage))
	if err != nil {
		t.Fatal(err)
	}
	after := scrape(t, admin)
	between := func(what string, shown string, name string, labels ...string) {
		t.Helper()
		lo, hi, got := sum(before, name, labels...), sum(after, name, labels...), number(t, shown)
		if got < lo || got > hi {
			t.Errorf("%s: the page shows %d, /metrics read %d before and %d after", what, got, lo, hi)
		}
	}
	for _, class := range []string{"default", "sheddable"} {
		c := page.Classes[class]
		if c == nil {
			t.Fatalf("the page has no row for class %s: %+v", class, page.Classes)
		}
		cl := `class="` + class + `"`
		between(class+" offered", c["offered"], "sluice_requests_offered_total", cl)
		between(class+" admitted", c["admitted"], "sluice_requests_admitted_total", cl)
		between(class+" useful", c["useful"], "sluice_requests_completed_total", cl, `outcome="useful"`)
		between(class+" rejected", c["rejected"], "sluice_requests_rejected_total", cl, `mode="enforce"`)
		between(class+" consumed", c["consumed"], "sluice_demand_units_total", cl, `stage="consumed"`)
	}
	if !strings.Contains(page.Classes["default"]["reasons"], "policy_rate") {
		t.Errorf("default's rejections by reason: %q", page.Classes["default"]["reasons"])
	}
	noisy := metrics.HashTenant("sk_noisy")
	row := page.Tenants[noisy]
	if row == nil {
		t.Fatalf("the noisy tenant %s is not among the tenants rejected most: %+v", noisy, page.Tenants)
	}
	between("the noisy tenant's rejections", row["count"], "sluice_requests_rejected_total", `tenant="`+noisy+`"`, `mode="enforce"`)
	if row["error"] != "0" || !strings.Contains(row["by"], "policy_rate") {
		t.Errorf("noisy tenant row %+v", row)
	}
	if number(t, page.Totals["inflight"]) < 0 || page.Totals["offered"] == "–" || page.Totals["rejected"] == "–" {
		t.Errorf("totals %+v", page.Totals)
	}
	if g := page.Gates["ladder"]; g == nil || g["mode"] != "enforce" || !strings.Contains(g["state"], "ladder normal") {
		t.Errorf("ladder row %+v", g)
	}
	if g := page.Gates["pool"]; g == nil || !strings.Contains(g["state"], "queue") {
		t.Errorf("pool row %+v", g)
	}

	// Switch the rate gate to shadow through the page.
	row0 := `#gates tr[data-gate="request-rate"]`
	if err := chromedp.Do(cctx,
		chromedp.SendKeys(chromedp.CSS(`#token`), "live-secret"),
		chromedp.SetValue(chromedp.CSS(row0+` select`), "shadow"),
		chromedp.Click(chromedp.CSS(row0+` button.apply`)),
		chromedp.WaitVisible(chromedp.CSS(`#switch-result.ok`)),
	); err != nil {
		t.Fatal(err)
	}
	result, err := chromedp.Run(cctx, chromedp.Text(chromedp.CSS(`#switch-result`)))
	if err != nil {
		t.Fatal(err)
	}
	if result != "request-rate is now in shadow mode" {
		t.Fatalf("the page says %q", result)
	}
	req, _ := http.NewRequest("GET", admin+"/v1/gates", nil)
	req.Header.Set("Authorization", "Bearer live-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var gates []struct{ Name, Mode string }
	json.NewDecoder(resp.Body).Decode(&gates)
	resp.Body.Close()
	if fmt.Sprint(gates) != "[{request-rate shadow} {ladder enforce} {pool enforce}]" {
		t.Fatalf("/v1/gates after the switch: %v", gates)
	}
	var mode string
	for mode != "shadow" {
		time.Sleep(50 * time.Millisecond)
		if mode, err = chromedp.Run(cctx, chromedp.Text(chromedp.CSS(row0+` td[data-field="mode"]`))); err != nil {
			t.Fatal(err)
		}
	}
	waitPolls(polls() + 8) // the plots show the noisy tenant admitted in shadow mode
	screenshot(t, cctx)

	// A wrong token is refused, and the page says so.
	if err := chromedp.Do(cctx,
		chromedp.SetValue(chromedp.CSS(`#token`), "wrong"),
		chromedp.SetValue(chromedp.CSS(row0+` select`), "off"),
		chromedp.Click(chromedp.CSS(row0+` button.apply`)),
		chromedp.WaitVisible(chromedp.CSS(`#switch-result.error`)),
	); err != nil {
		t.Fatal(err)
	}
	if result, err = chromedp.Run(cctx, chromedp.Text(chromedp.CSS(`#switch-result`))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(result, "missing or wrong admin token") {
		t.Fatalf("the page says %q after a wrong token", result)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, r := range requested {
		if !strings.HasPrefix(r, admin+"/") {
			t.Errorf("the page requested %s, outside the admin listener", r)
		}
	}
	if len(requested) < 3 {
		t.Errorf("requests seen: %v", requested)
	}
	if len(exceptions) > 0 {
		t.Errorf("script errors: %v", exceptions)
	}
}

// browser starts headless Chromium with a fresh profile and nothing that
// would reach the network.
func browser(t *testing.T, bin string) (context.Context, context.CancelFunc) {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1400),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	cctx, cancelCtx := chromedp.NewContext(actx)
	tctx, cancelTimeout := context.WithTimeout(cctx, 3*time.Minute) // a hung browser fails the test instead of the whole run
	return tctx, func() { cancelTimeout(); cancelCtx(); cancelAlloc() }
}

// screenshot writes the whole page to live.png in the test's artifact
// directory.
func screenshot(t *testing.T, ctx context.Context) {
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.ArtifactDir(), "live.png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", file, len(png))
}
