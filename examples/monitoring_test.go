package examples_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/host"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// promtool returns the promtool binary (Debian's prometheus package ships
// it), skipping t when there is none unless SLUICE_REQUIRE_PROMTOOL=1.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if os.Getenv("SLUICE_REQUIRE_PROMTOOL") == "1" {
		t.Fatal("promtool is not installed and SLUICE_REQUIRE_PROMTOOL=1")
	}
	t.Skip("promtool is not installed (apt-get install prometheus; SLUICE_REQUIRE_PROMTOOL=1 makes this a failure)")
	return ""
}

func runTool(t *testing.T, dir string, stdin io.Reader, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Stdin = dir, stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The alert rules are valid and their unit tests, on synthetic series,
// pass.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	runTool(t, "prometheus", nil, bin, "check", "rules", "alerts.yml")
	out := runTool(t, "prometheus", nil, bin, "test", "rules", "alerts_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", out)
	}
}

// The dashboard's queries are PromQL that Prometheus parses, once its
// Grafana variables are filled in: each becomes a recording rule for
// promtool check rules.
func TestDashboardQueriesParse(t *testing.T) {
	bin := promtool(t)
	exprs := dashboardExprs(t)
	fill := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	var rules []map[string]string
	for i, e := range exprs {
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": fill.Replace(e)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runTool(t, dir, nil, bin, "check", "rules", "dashboard.yml")
	if !strings.Contains(out, fmt.Sprintf("%d rules found", len(exprs))) {
		t.Fatalf("promtool check rules:\n%s", out)
	}
}

// dashboardExprs returns the query of every panel target of the Grafana
// dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/sluice.json: %v", err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	if len(exprs) < 20 {
		t.Fatalf("only %d queries in the dashboard", len(exprs))
	}
	return exprs
}

// alertExprs returns the expressions of alerts.yml by alert name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("prometheus/alerts.yml: %v", err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// The gates that export each kind of metric, under traffic that admits,
// completes, rejects and queues, so that every series has a sample.
const everyMetric = `version: 1
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: "/reports/*"}, class: sheddable}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/h, burst: 2}
  - {name: ladder, kind: ladder, workers: 4}
  - {name: util, kind: utilization, workers: 4, tiers: [sheddable, default]}
  - {name: adaptive, kind: adaptive_concurrency, initial: 30, min: 5, max: 100}
  - {name: pool, kind: concurrency, limit: 5, queue: {max_wait: 50ms, classes: [default]}}
`

// exported scrapes /metrics of a host running everyMetric and returns the
// metric names it serves.
func exported(t *testing.T) (map[string]bool, string) {
	t.Helper()
	h, err := host.New(host.Options{Config: "every.yaml", ConfigData: []byte(everyMetric), Clock: fakeclock.New(1),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	app := h.Middleware().Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/x", "/x", "/x", "/reports/1"} { // the third /x is over its rate
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-Api-Key", "acme")
		app.ServeHTTP(httptest.NewRecorder(), r)
	}
	w := httptest.NewRecorder()
	h.AdminHandler("secret").ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(w.Body.String()))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, w.Body.String()
}

var metricName = regexp.MustCompile(`\bsluice_[a-z0-9_]+\b`)

// Every metric the dashboard and the alert rules name is one /metrics
// serves, and they cover what an operator watches.
func TestMonitoringNamesAreExported(t *testing.T) {
	names, _ := exported(t)
	alerts := alertExprs(t)
	sources := map[string][]string{"grafana/sluice.json": dashboardExprs(t)}
	for name, e := range alerts {
		sources["prometheus/alerts.yml "+name] = append(sources["prometheus/alerts.yml "+name], e)
	}
	used := map[string]bool{}
	for src, exprs := range sources {
		for _, e := range exprs {
			for _, n := range metricName.FindAllString(e, -1) {
				used[n] = true
				if !names[n] {
					t.Errorf("%s uses %s, which /metrics does not serve", src, n)
				}
			}
		}
	}
	for _, want := range []string{"sluice_requests_offered_total", "sluice_requests_admitted_total", "sluice_requests_rejected_total",
		"sluice_requests_completed_total", "sluice_demand_units_total", "sluice_goodput_units_total", "sluice_requests_inflight",
		"sluice_queue_oldest_seconds", "sluice_ladder_level", "sluice_gate_store_failures_total", "sluice_shed_fraction", "sluice_concurrency_limit"} {
		if !used[want] {
			t.Errorf("neither the dashboard nor the alerts use %s", want)
		}
	}
	if !slices.ContainsFunc(dashboardExprs(t), func(e string) bool { return strings.HasPrefix(e, "topk(10, sum by (tenant)") }) {
		t.Error("the dashboard has no per-tenant topk")
	}
	for alert, want := range map[string]string{"SluiceTenantRejected": "by (job, tenant)", "SluiceFailOpen": `policy="fail_open"`,
		"SluiceLadderShedding": "sluice_ladder_level", "SluiceStoreFailures": "sluice_gate_store_failures_total"} {
		if !strings.Contains(alerts[alert], want) {
			t.Errorf("alert %s: %q does not have %s", alert, alerts[alert], want)
		}
	}
}

// The names the test reads are the names of a real scrape: the check
// fails for a name that is not served.
func TestMonitoringNamesCheckCatchesAMissingName(t *testing.T) {
	names, body := exported(t)
	if names["sluice_requests_offered_totals"] || !names["sluice_requests_offered_total"] || !names["sluice_decision_duration_seconds_bucket"] {
		t.Fatalf("names read from /metrics: %v", names)
	}
	if _, err := exec.LookPath("promtool"); err == nil || os.Getenv("SLUICE_REQUIRE_PROMTOOL") == "1" {
		runTool(t, "", strings.NewReader(body), promtool(t), "check", "metrics") // the exposition passes promtool's linter
	}
}
