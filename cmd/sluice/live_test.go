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
// opens the live page in headless Chromium once the server has a few
// seconds of history, and checks that the charts open on them. It checks
// the numbers the page shows against /metrics and /v1/live read just
// before and just after the page's reading (the tolerance is the traffic
// between the two: the page must lie between them), that every series is
// drawn on an axis of its own unit, that no tenant key is on the page
// until the admin token is typed and then the noisy tenant's is, switches
// a gate to shadow through the page, keeps a screenshot (live.png in the
// test's artifact directory: go test -artifacts keeps it), and tries a
// wrong token.
func TestLivePageInChromium(t *testing.T) {
	bin := chromium(t)
	base, admin := startProxy(t)
	startLoad(t, base)
	for len(liveHistory(t, admin)) < 6 { // one reading a second since the proxy started
		time.Sleep(200 * time.Millisecond)
	}
	p := openPage(t, bin, admin)
	p.waitPolls(1)
	p.checkHistory(6)
	p.waitPolls(8) // rates need two readings; the plots some more
	p.checkCharts()

	// Scrape, wait for a reading the page began after the scrape (the
	// second poll from now: the first may have been in flight), read the
	// page, scrape again.
	before, liveBefore := scrape(t, admin), readLive(t, admin)
	p.waitPolls(p.polls() + 2)
	page, err := chromedp.Run(p.ctx, chromedp.Evaluate[pageNumbers](readPage))
	if err != nil {
		t.Fatal(err)
	}
	after, liveAfter := scrape(t, admin), readLive(t, admin)
	checkAgainstMetrics(t, page, before, after)
	checkAgainstLive(t, page, liveBefore, liveAfter)
	if html := p.html(); strings.Contains(html, "sk_noisy") || strings.Contains(html, "sk_calm") {
		t.Fatal("a tenant key is on the page before the admin token is typed")
	}

	if got := p.switchMode("request-rate", "shadow", "live-secret", "ok"); got != "request-rate is now in shadow mode" {
		t.Fatalf("the page says %q", got)
	}
	if got := gateModes(t, admin); got != "[{request-rate shadow} {ladder enforce} {pool enforce}]" {
		t.Fatalf("/v1/gates after the switch: %v", got)
	}
	for p.text(`#gates tr[data-gate="request-rate"] td[data-field="mode"]`) != "shadow" {
		time.Sleep(50 * time.Millisecond)
	}
	// With the token typed in (for the switch), the page shows the keys
	// behind the labels it lists, and finds a tenant by key or label.
	p.waitKey("sk_noisy")
	if got := p.find("sk_calm"); got != "sk_calm has label "+metrics.HashTenant("sk_calm") {
		t.Errorf("find by key: %q", got)
	}
	if got := p.find(metrics.HashTenant("sk_noisy")); got != metrics.HashTenant("sk_noisy")+" is sk_noisy" {
		t.Errorf("find by label: %q", got)
	}
	p.waitPolls(p.polls() + 8) // the plots show the noisy tenant admitted in shadow mode
	screenshot(t, p.ctx)

	if got := p.switchMode("request-rate", "off", "wrong", "error"); !strings.Contains(got, "missing or wrong admin token") {
		t.Fatalf("the page says %q after a wrong token", got)
	}
	p.checkRequests(admin)
}

// startProxy runs sluice proxy on livePolicy in front of a no-op upstream
// until the test ends.
func startProxy(t *testing.T) (base, admin string) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
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
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	pa, aa := s.Addrs()
	return "http://" + pa.String(), "http://" + aa.String()
}

// startLoad sends three tenants' requests until the test ends, and
// returns once every tenant has a label in /metrics and the noisy one is
// rejected.
func startLoad(t *testing.T, base string) {
	loads := []*load{
		{tenant: "sk_noisy", path: "/routes/1", pause: time.Millisecond},         // far over 20/s: mostly rejected
		{tenant: "sk_calm", path: "/routes/2", pause: 100 * time.Millisecond},    // under its rate
		{tenant: "sk_reports", path: "/reports/3", pause: 60 * time.Millisecond}, // another class
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range loads {
		wg.Go(func() { l.run(ctx, base) })
	}
	t.Cleanup(func() { stop(); wg.Wait() })
	for loads[0].rejected.Load() < 50 || loads[1].ok.Load() < 10 || loads[2].ok.Load() < 10 {
		time.Sleep(20 * time.Millisecond)
	}
}

// checkAgainstMetrics wants every count the page shows between the
// scrapes before and after its reading.
func checkAgainstMetrics(t *testing.T, page pageNumbers, before, after map[string]float64) {
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
}

// liveReading is what the test reads of /v1/live: the classes' counts.
type liveReading struct {
	Classes []metrics.ClassCounts `json:"classes"`
}

// readLive reads /v1/live.
func readLive(t *testing.T, admin string) map[string]metrics.ClassCounts {
	t.Helper()
	resp, err := http.Get(admin + "/v1/live")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l liveReading
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	out := map[string]metrics.ClassCounts{}
	for _, c := range l.Classes {
		out[c.Class] = c
	}
	return out
}

// liveHistory reads /v1/live/history's readings.
func liveHistory(t *testing.T, admin string) []json.RawMessage {
	t.Helper()
	resp, err := http.Get(admin + "/v1/live/history")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct{ Readings []json.RawMessage }
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h.Readings
}

// checkAgainstLive wants every class count the page shows between the
// /v1/live readings before and after its own.
func checkAgainstLive(t *testing.T, page pageNumbers, before, after map[string]metrics.ClassCounts) {
	total := func(m map[string]int64) int64 {
		var n int64
		for _, v := range m {
			n += v
		}
		return n
	}
	for _, class := range []string{"default", "sheddable"} {
		c, lo, hi := page.Classes[class], before[class], after[class]
		for _, f := range []struct {
			field  string
			lo, hi int64
		}{
			{"offered", lo.Offered, hi.Offered},
			{"admitted", lo.Admitted, hi.Admitted},
			{"useful", lo.Completed["useful"], hi.Completed["useful"]},
			{"rejected", total(lo.Rejected), total(hi.Rejected)},
			{"consumed", lo.Units["consumed"], hi.Units["consumed"]},
		} {
			if got := number(t, c[f.field]); got < f.lo || got > f.hi {
				t.Errorf("%s %s: the page shows %d, /v1/live read %d before and %d after", class, f.field, got, f.lo, f.hi)
			}
		}
	}
}

// gateModes reads /v1/gates with the token.
func gateModes(t *testing.T, admin string) string {
	req, _ := http.NewRequest("GET", admin+"/v1/gates", nil)
	req.Header.Set("Authorization", "Bearer live-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var gates []struct{ Name, Mode string }
	json.NewDecoder(resp.Body).Decode(&gates)
	return fmt.Sprint(gates)
}

// livePage is the page open in a browser tab, with what the tab fetched
// and the script errors it threw.
type livePage struct {
	t   *testing.T
	ctx context.Context

	mu                    sync.Mutex
	requested, exceptions []string
}

func openPage(t *testing.T, bin, admin string) *livePage {
	ctx, cancel := browser(t, bin)
	t.Cleanup(cancel)
	p := &livePage{t: t, ctx: ctx}
	if err := chromedp.Listen(ctx, p.event); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1440, 1400), chromedp.Navigate(admin+"/")); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *livePage) event(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		p.requested = append(p.requested, ev.Request.URL)
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		p.exceptions = append(p.exceptions, fmt.Sprintf("%s:%d: %s", d.URL, d.LineNumber, d.Text))
	}
}

// polls returns the readings the page has made.
func (p *livePage) polls() int {
	n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](`Number(document.body.dataset.polls)`))
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

func (p *livePage) waitPolls(n int) {
	for p.polls() < n {
		time.Sleep(100 * time.Millisecond)
	}
}

// checkHistory wants the page, after its first poll, to hold at least n
// readings and to have drawn them.
func (p *livePage) checkHistory(n int) {
	got, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]int](`[Number(document.body.dataset.history),
		Number(document.querySelector('#chart-requests path[data-name="offered"]')?.dataset.points ?? 0)]`))
	if err != nil {
		p.t.Fatal(err)
	}
	if got[0] < n || got[1] < n-1 {
		p.t.Errorf("after its first poll the page holds %d readings and plots %d rates, want %d and %d from the server's history", got[0], got[1], n, n-1)
	}
}

// checkCharts wants each chart's unit and every series of the requests
// chart drawn, admitted dashed over useful.
func (p *livePage) checkCharts() {
	got, err := chromedp.Run(p.ctx, chromedp.Evaluate[map[string]string](`(() => {
		const out = {};
		for (const c of document.querySelectorAll('svg.chart')) out[c.id] = c.querySelector('text.unit')?.textContent ?? '';
		for (const path of document.querySelectorAll('#chart-requests path.series')) out[path.dataset.name] = path.getAttribute('stroke-dasharray') ?? 'solid';
		return out;
	})()`))
	if err != nil {
		p.t.Fatal(err)
	}
	want := map[string]string{"chart-requests": "req/s", "chart-reasons": "req/s", "chart-units": "units/s", "chart-tenants": "req/s",
		"chart-queues": "seconds", "chart-inflight": "requests", "offered": "solid", "useful": "solid", "admitted": "5 3", "rejected": "solid"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		p.t.Errorf("charts: %v, want %v", got, want)
	}
}

// html returns the page's markup as it is now.
func (p *livePage) html() string {
	s, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// waitKey waits until the tenants rejected most show key.
func (p *livePage) waitKey(key string) {
	if err := chromedp.Do(p.ctx, chromedp.WaitVisible(chromedp.CSS(`#top-rejected td[data-key="`+key+`"]`))); err != nil {
		p.t.Fatal(err)
	}
}

// find looks a tenant up in the page's find box and returns what it says.
func (p *livePage) find(v string) string {
	if _, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.querySelector('#find').value = ''; document.querySelector('#find-result').className = 'result'`)); err != nil {
		p.t.Fatal(err)
	}
	if err := chromedp.Do(p.ctx,
		chromedp.SendKeys(chromedp.CSS(`#find`), v),
		chromedp.Click(chromedp.CSS(`#find-go`)),
		chromedp.WaitVisible(chromedp.CSS(`#find-result.ok`)),
	); err != nil {
		p.t.Fatal(err)
	}
	return p.text(`#find-result`)
}

func (p *livePage) text(sel string) string {
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// switchMode types token, picks mode for gate and applies it, and returns
// what the page then says (once its result has class want: ok or error).
func (p *livePage) switchMode(gate, mode, token, want string) string {
	row := `#gates tr[data-gate="` + gate + `"]`
	if err := chromedp.Do(p.ctx,
		chromedp.Clear(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		chromedp.SetValue(chromedp.CSS(row+` select`), mode),
		chromedp.Click(chromedp.CSS(row+` button.apply`)),
		chromedp.WaitVisible(chromedp.CSS(`#switch-result.`+want)),
	); err != nil {
		p.t.Fatal(err)
	}
	return p.text(`#switch-result`)
}

// checkRequests wants every request of the page on the admin listener,
// and no script error.
func (p *livePage) checkRequests(admin string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.requested {
		if !strings.HasPrefix(r, admin+"/") {
			p.t.Errorf("the page requested %s, outside the admin listener", r)
		}
	}
	if len(p.requested) < 3 {
		p.t.Errorf("requests seen: %v", p.requested)
	}
	if len(p.exceptions) > 0 {
		p.t.Errorf("script errors: %v", p.exceptions)
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
