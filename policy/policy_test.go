package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/examples"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

const good = `version: 1
service: s
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 100/s, burst: 500}
  - {name: inflight, kind: concurrency, limit: 20}
`

func TestExamplesPass(t *testing.T) {
	for _, n := range examples.Names() {
		data, name, _ := examples.ByName(n)
		f, err := Parse(name, data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rt, err := Build(f, nil, Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rt.Close() // a leased gate's refresh loop runs until then
		spec := f.SpecText()
		for _, want := range []string{"ADMISSION POLICY", "WORK MODEL", "HIERARCHY", "STATE MACHINE", "FAILURE AND CLIENT CONTRACT", "EVIDENCE", "429", "503"} {
			if !strings.Contains(spec, want) {
				t.Fatalf("%s: spec lacks %q", name, want)
			}
		}
	}
	// The files on disk are the embedded ones.
	for _, name := range []string{"routes-api.yaml", "mercury.yaml", "routes-api-shedding.yaml", "lease-fleet.yaml"} {
		if _, err := Load("../examples/" + name); err != nil {
			t.Fatal(err)
		}
	}
}

// Each broken policy gives exactly one clear error, at the right line and
// field.
func TestBrokenPolicies(t *testing.T) {
	for _, c := range []struct {
		name, file string
		line       int
		field, msg string
	}{
		{"unknown kind", "version: 1\ngates:\n  - {name: a, kind: token_buket, rate: 1/s, burst: 1}\n", 3, "gates[0].kind", `unknown kind "token_buket"`},
		{"missing rate", "version: 1\ngates:\n  - name: a\n    kind: token_bucket\n    burst: 5\n", 3, "gates[0].rate", "missing: kind token_bucket needs rate and burst"},
		{"bad rate unit", "version: 1\ngates:\n  - name: a\n    kind: gcra\n    rate: 100/x\n    burst: 5\n", 5, "gates[0].rate", `bad period "x"`},
		{"negative burst", "version: 1\ngates:\n  - name: a\n    kind: token_bucket\n    rate: 1/s\n    burst: -5\n", 6, "gates[0].burst", "-5 is out of range"},
		{"duplicate gate name", "version: 1\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n  - {name: a, kind: concurrency, limit: 2}\n", 4, "gates[1].name", `duplicate gate name "a" (first at line 3)`},
		{"bad indentation", "version: 1\ngates:\n  - name: a\n     kind: concurrency\n", 4, "(yaml)", "mapping values are not allowed"},
		{"unknown field", "version: 1\ngates:\n  - {name: a, kind: concurrency, limit: 1, burts: 3}\n", 3, "gates[0].burts", "unknown field"},
		{"field of another kind", "version: 1\ngates:\n  - name: a\n    kind: concurrency\n    limit: 5\n    burst: 9\n", 6, "gates[0].burst", "does not apply to kind concurrency"},
		{"zero rate", "version: 1\ngates:\n  - {name: a, kind: token_bucket, rate: 0/s, burst: 1}\n", 3, "gates[0].rate", "rate must be > 0"},
		{"bad window", "version: 1\ngates:\n  - {name: a, kind: fixed_window, limit: 5, window: soon}\n", 3, "gates[0].window", `"soon" is not a duration`},
		{"bad mode", "version: 1\ngates:\n  - {name: a, kind: concurrency, limit: 5, mode: dark}\n", 3, "gates[0].mode", `"dark" is not one of enforce, shadow, off`},
		{"bad scope", "version: 1\ngates:\n  - {name: a, kind: concurrency, limit: 5, scope: planet}\n", 3, "gates[0].scope", `unknown scope "planet"`},
		{"missing gates", "version: 1\nservice: x\n", 1, "gates", "missing (required)"},
		{"deadline default above max", "version: 1\nidentity:\n  deadline: {header: X-T, max: 1s, default: 10s}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 3, "identity.deadline.default", "10s, above the max of 1s"},
		{"shadowed route", "version: 1\nroutes:\n  - {match: {path: /*}}\n  - {match: {method: POST, path: /v1/x}, class: critical}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 4, "routes[1].match", "never matches: the route at line 3 (/*) comes first"},
		{"duplicate route", "version: 1\nroutes:\n  - {match: {method: GET, path: /a}}\n  - {match: {method: GET, path: /a}, cost: 5}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 4, "routes[1].match", "never matches: the route at line 3 (GET /a)"},
		{"fleet usage without a reserve", "version: 1\nstore: {backend: redis, addrs: [127.0.0.1:1]}\ngates:\n  - {name: f, kind: fleet_usage, limit: 10, reserve: {}}\n", 4, "gates[0].reserve", "no class"},
		{"queue percentile 0", "version: 1\ngates:\n  - {name: c, kind: concurrency, limit: 5, queue: {max_wait: 100ms, percentile: 0}}\n", 3, "gates[0].queue.percentile", "0: want a percentile from 50% to 100%"},
		{"deadline max alone", "version: 1\nidentity:\n  deadline:\n    max: 1s\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 4, "identity.deadline.max", "bounds nothing without a header or a default"},
		{"wrong version", "version: 2\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 1, "version", "out of range [1, 1]"},
		{"route path", "version: 1\nroutes:\n  - {match: {path: v1/x}}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 3, "routes[0].match.path", "must start with /"},
		{"cost bounds", "version: 1\nroutes:\n  - {match: {path: /x}, cost: {header: X-N, min: 9, max: 2}}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 3, "routes[0].cost", "min 9 is above max 2"},
		{"huge burst for rate", "version: 1\nidentity: {tenant: {header: X-K}}\ngates:\n  - {name: a, kind: token_bucket, rate: 1/d, burst: 1000000000}\n", 4, "gates[0].burst", "too large for rate"},
		{"empty name", "version: 1\ngates:\n  - {name: \"\", kind: concurrency, limit: 1}\n", 3, "gates[0].name", "gate names use"},
		{"empty kind", "version: 1\ngates:\n  - {name: a, kind: \"\", limit: 1}\n", 3, "gates[0].kind", `unknown kind ""`},
		{"two documents", "version: 1\ngates: []\n---\nversion: 1\n", 3, "(file)", "more than one YAML document"},
		{"class no route assigns", "version: 1\nroutes:\n  - {match: {path: /x}, class: critical}\ngates:\n  - {name: a, kind: concurrency, limit: 1, classes: [critcal]}\n", 5, "gates[0].classes[0]", `no route assigns class "critcal"`},
		{"window too long", "version: 1\nidentity: {tenant: {header: X-K}}\ngates:\n  - {name: a, kind: fixed_window, limit: 1, window: 1500000h}\n", 4, "gates[0].window", "366 days"},
		{"utilization good above bad", "version: 1\ngates:\n  - name: u\n    kind: utilization\n    workers: 4\n    good: 0.9\n    bad: 0.8\n    tiers: [default]\n", 6, "gates[0].good", "good 0.9 must be below bad 0.8"},
		{"utilization negative delay", "version: 1\ngates:\n  - {name: u, kind: utilization, workers: 4, delay: -5s, tiers: [default]}\n", 3, "gates[0].delay", "must be at least 0s"},
		{"utilization unknown tier", "version: 1\nroutes:\n  - {match: {path: /a}, class: sandbox}\ngates:\n  - {name: u, kind: utilization, workers: 4, tiers: [sandbox, sheddabel, default]}\n", 5, "gates[0].tiers[1]", `unknown tier or class "sheddabel"`},
		{"fleet usage reserves everything", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - {name: f, kind: fleet_usage, limit: 10, reserve: {critical: 100%}}\n", 5, "gates[0].reserve", "want a share in (0, 1)"},
		{"ladder without hysteresis", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, degrade: {enter: 0.7, exit: 0.8}}\n", 3, "gates[0].degrade", "must be below degrade enter"},
		{"utilization good 0", "version: 1\ngates:\n  - {name: u, kind: utilization, workers: 4, good: 0, bad: 0.5, tiers: [default]}\n", 3, "gates[0].good", "0 reads as unset here; leave the field out for the default (0.7)"},
		{"utilization delay 0s", "version: 1\ngates:\n  - {name: u, kind: utilization, workers: 4, delay: 0s, tiers: [default]}\n", 3, "gates[0].delay", "0 reads as unset"},
		{"ladder min_dwell 0s", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, min_dwell: 0s}\n", 3, "gates[0].min_dwell", "0 reads as unset"},
		{"ladder exit 0", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, degrade: {enter: 0.8, exit: 0}}\n", 3, "gates[0].degrade.exit", "0 reads as unset"},
		{"deadline percentile 0", "version: 1\ngates:\n  - {name: d, kind: deadline, percentile: 0%}\n", 3, "gates[0].percentile", "0 reads as unset"},
		{"fleet usage class twice", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: f\n    kind: fleet_usage\n    limit: 10\n    reserve: {critical: 20%, critical: 90%}\n", 8, "gates[0].reserve.critical", "class critical listed twice (first at line 8)"},
		{"classes twice", "version: 1\nroutes:\n  - {match: {path: /x}, class: critical}\ngates:\n  - {name: a, kind: concurrency, limit: 1, classes: [critical, critical]}\n", 5, "gates[0].classes[1]", "class critical listed twice"},
		{"ladder scope", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, scope: tenant}\n", 3, "gates[0].scope", "does not apply to kind ladder"},
		{"tab indentation", "version: 1\ngates:\n\t- {name: a, kind: concurrency, limit: 1}\n", 3, "(yaml)", "a tab in the indentation"},
		{"ladder shed without hysteresis", "version: 1\ngates:\n  - name: l\n    kind: ladder\n    workers: 4\n    shed: {enter: 0.9, exit: 0.95}\n", 6, "gates[0].shed", "shed exit 0.95 must be below shed enter 0.9"},
		{"ladder recover steps", "version: 1\ngates:\n  - name: l\n    kind: ladder\n    workers: 4\n    recover: [50%, 25%]\n", 6, "gates[0].recover", "must increase"},
		{"utilization bad above 1", "version: 1\ngates:\n  - name: u\n    kind: utilization\n    workers: 4\n    bad: 1.5\n    tiers: [default]\n", 6, "gates[0].bad", "bad 1.5"},
		{"redis burst beyond doubles", "version: 1\nstore: {backend: redis, addrs: [\"127.0.0.1:1\"]}\ngates:\n  - name: a\n    kind: token_bucket\n    scope: service\n    rate: 1/s\n    burst: 10000000\n", 8, "gates[0].burst", "exceeds 2^53"},
		{"on_failure of a process gate", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, on_failure: fail_closed}\n", 3, "gates[0].on_failure", "does not apply to kind ladder"},
		{"deadline percentile", "version: 1\ngates:\n  - {name: d, kind: deadline, percentile: 100%}\n", 3, "gates[0].percentile", "want (0, 1)"},
		{"deadline scope", "version: 1\ngates:\n  - {name: d, kind: deadline, scope: tenant}\n", 3, "gates[0].scope", "does not apply to kind deadline"},
		{"adaptive target of gradient2", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, target: 5ms}\n", 3, "gates[0].target", "queue_delay only"},
		{"adaptive smoothing of aimd", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: aimd, smoothing: 0.5}\n", 3, "gates[0].smoothing", "gradient2 and vegas only"},
		{"adaptive smoothing above 1", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: gradient2, smoothing: 1.5}\n", 3, "gates[0].smoothing", "want (0, 1]"},
		{"adaptive smoothing on bbr", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, smoothing: 0.5}\n", 3, "gates[0].smoothing", "gradient2 and vegas only"},
		{"adaptive headroom on gradient2", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: gradient2, headroom: 0.2}\n", 3, "gates[0].headroom", "bbr only"},
		{"adaptive headroom above 1", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, headroom: 1.5}\n", 3, "gates[0].headroom", "want (0, 1]"},
		{"adaptive probe interval short", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, probe_interval: 10ms}\n", 3, "gates[0].probe_interval", "1s"},
		{"adaptive smoothing 0", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: vegas, smoothing: 0}\n", 3, "gates[0].smoothing", "above 0"},
		{"adaptive bounds", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, min: 50, max: 10}\n", 3, "gates[0].max", "below min"},
		{"adaptive queue delay without target", "version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: queue_delay}\n", 3, "gates[0].target", "target"},
		{"queue per tenant", "version: 1\nidentity: {tenant: {header: X-K}}\ngates:\n  - {name: c, kind: concurrency, scope: tenant, limit: 5, queue: {max_wait: 50ms}}\n", 4, "gates[0].queue", "needs scope service"},
		{"queue on redis", "version: 1\nstore: {backend: redis, addrs: [\"127.0.0.1:1\"]}\ngates:\n  - {name: c, kind: concurrency, limit: 5, queue: {max_wait: 50ms}}\n", 4, "gates[0].queue", "on redis"},
		{"queue class", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - {name: c, kind: adaptive_concurrency, queue: {classes: [critcal]}}\n", 5, "gates[0].queue", `unknown class "critcal"`},
		{"queue field", "version: 1\ngates:\n  - {name: c, kind: concurrency, limit: 5, queue: {wait: 50ms}}\n", 3, "gates[0].queue.wait", "unknown field"},
		{"reservation over capacity", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    recovery: 10\n    shares:\n      critical: {reserve: 95}\n", 10, "gates[0].shares.critical.reserve", "95 above the usable 90"},
		{"reservation reserves sum over capacity", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\n  - {match: {path: /b}, class: sheddable}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    shares:\n      critical: {reserve: 60}\n      sheddable: {reserve: 50}\n", 9, "gates[0].shares", "reserves add up to 110"},
		{"reservation bucket below a request", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical, cost: 30}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 1000\n    shares:\n      critical:\n        reserve: 100\n", 10, "gates[0].shares.critical.reserve", "raise burst to at least 300ms"},
		{"reservation unknown class", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    shares:\n      critcal: {reserve: 50}\n", 9, "gates[0].shares.critcal", `no route assigns class "critcal"`},
		{"reservation share without reserve", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    shares:\n      critical: {max: 50}\n", 9, "gates[0].shares.critical.reserve", "missing"},
		{"reservation share field", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    shares:\n      critical: {reserve: 50, borow: false}\n", 9, "gates[0].shares.critical.borow", "unknown field"},
		{"reservation max below reserve", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - name: r\n    kind: reservation\n    capacity: 100\n    shares:\n      critical: {reserve: 50, max: 40}\n", 9, "gates[0].shares.critical.max", "below the class's reserve"},
		{"reservation zero capacity", "version: 1\ngates:\n  - {name: r, kind: reservation, capacity: 0, shares: {default: {reserve: 0}}}\n", 3, "gates[0].capacity", "out of range"},
		{"reservation capacity and inflight", "version: 1\ngates:\n  - {name: r, kind: reservation, capacity: 10, inflight: 10, shares: {default: {reserve: 1}}}\n", 3, "gates[0].inflight", "not both"},
		{"reservation neither", "version: 1\ngates:\n  - {name: r, kind: reservation, shares: {default: {reserve: 1}}}\n", 3, "gates[0].capacity", "missing"},
		{"reservation queue on a rate", "version: 1\ngates:\n  - {name: r, kind: reservation, capacity: 10, shares: {default: {reserve: 1}}, queue: {max_wait: 50ms}}\n", 3, "gates[0].queue", "needs inflight"},
		{"reservation inflight tenant", "version: 1\ngates:\n  - {name: r, kind: reservation, inflight: 10, shares: {default: {reserve: 1, tenant: 2}}}\n", 3, "gates[0].shares.default.tenant", "applies to rates"},
		{"reservation never admits a class", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - {name: r, kind: reservation, capacity: 10, shares: {critical: {reserve: 0, borrow: false}}}\n", 5, "gates[0].shares.critical.borrow", "never admitted"},
		{"reservation max without borrowing", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - {name: r, kind: reservation, capacity: 100, shares: {critical: {reserve: 20, max: 50, borrow: false}}}\n", 5, "gates[0].shares.critical.max", "never be reached"},
		{"reservation tenant above max", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\ngates:\n  - {name: r, kind: reservation, capacity: 100, shares: {critical: {reserve: 10, max: 20, tenant: 50}}}\n", 5, "gates[0].shares.critical.tenant", "never binds"},
		{"reservation share outside its classes", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical}\n  - {match: {path: /b}, class: sheddable}\ngates:\n  - {name: r, kind: reservation, capacity: 100, classes: [sheddable], shares: {critical: {reserve: 10}}}\n", 6, "gates[0].shares.critical.reserve", "never used"},
		{"inflight cost above the units", "version: 1\nroutes:\n  - {match: {path: /a}, class: critical, cost: 2}\ngates:\n  - {name: r, kind: reservation, inflight: 1, shares: {critical: {reserve: 1}}}\n", 5, "gates[0].shares.critical.reserve", "never admitted"},
		{"inflight unlisted class cannot borrow", "version: 1\nidentity: {deadline: {header: X-T, default: 5s}}\nroutes:\n  - {match: {path: /a}, class: critical}\n  - {match: {path: /b}, class: sheddable}\ngates:\n  - {name: r, kind: reservation, inflight: 10, shares: {critical: {reserve: 10}}}\n", 7, "gates[0].shares", "class sheddable (route at line 5) has no share"},
		{"typo names the field meant", "version: 1\ngates:\n  - {name: r, kind: reservation, capcity: 10, shares: {default: {reserve: 1}}}\n", 3, "gates[0].capcity", `unknown field; did you mean "capacity"?`},
		{"lease per tenant", "version: 1\nidentity: {tenant: {header: X-K}}\ngates:\n  - {name: r, kind: token_bucket, rate: 100/s, burst: 10, lease: {time: 10s}}\n", 4, "gates[0].lease", "needs scope service"},
		{"lease of a fractional rate", "version: 1\ngates:\n  - {name: r, kind: gcra, scope: service, rate: 1/m, burst: 1, lease: {time: 10s}}\n", 3, "gates[0].lease", "whole number of units per second"},
		{"lease burst", "version: 1\ngates:\n  - {name: r, kind: token_bucket, scope: service, rate: 100/s, burst: 1000, lease: {}}\n", 3, "gates[0].lease", "1ms to 1s"},
		{"lease refresh above its time", "version: 1\ngates:\n  - {name: r, kind: token_bucket, scope: service, rate: 100/s, burst: 10, lease: {time: 1s, refresh: 2s}}\n", 3, "gates[0].lease", "refresh interval"},
		{"lease failure mode", "version: 1\ngates:\n  - {name: r, kind: token_bucket, scope: service, rate: 100/s, burst: 10, lease: {on_failure: maybe}}\n", 3, "gates[0].lease.on_failure", "maybe"},
		{"fair weight", "version: 1\ngates:\n  - {name: c, kind: concurrency, limit: 5, queue: {fair: {weights: {acme: -2}}}}\n", 3, "gates[0].queue.fair.weights.acme", "out of range"},
		{"fair field", "version: 1\ngates:\n  - {name: c, kind: concurrency, limit: 5, queue: {fair: {weight: 2}}}\n", 3, "gates[0].queue.fair.weight", "unknown field"},
		{"ladder cohorts field", "version: 1\ngates:\n  - {name: l, kind: ladder, workers: 4, cohorts: {cout: 64}}\n", 3, "gates[0].cohorts.cout", "unknown field"},
		{"cohorts count", "version: 1\ngates:\n  - {name: u, kind: utilization, workers: 4, tiers: [default], cohorts: {count: 0}}\n", 3, "gates[0].cohorts.count", "out of range"},
		{"indentation at the end of a block", "version: 1\nidentity:\n  tenant: {header: X-Api-Key}\nroutes:\n  - match:\n      method: POST\n      path: /v1/routes\n    class: critical\n    cost: 2\n  class: default\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 10, "(yaml)", "did not find expected '-' indicator"},
		{"indentation at the end of a gate", "version: 1\ngates:\n  - name: a\n    kind: concurrency\n    limit: 1\n    mode: enforce\n    retry_hint: 1s\n   ttl: 5s\n", 8, "(yaml)", "did not find expected '-' indicator"},
		{"rate word", "version: 1\ngates:\n  - {name: a, kind: token_bucket, scope: service, rate: 10/sec, burst: 1}\n", 3, "gates[0].rate", `period "sec": write "s"`},
		{"rate with spaces", "version: 1\ngates:\n  - {name: a, kind: token_bucket, scope: service, rate: \"10 / s\", burst: 1}\n", 3, "gates[0].rate", "no spaces"},
		{"no gates", "version: 1\ngates: []\n", 2, "gates", "empty: a policy without gates admits every request"},
		{"per tenant without a tenant", "version: 1\ngates:\n  - {name: a, kind: token_bucket, rate: 1/s, burst: 1}\n", 3, "gates[0].scope", "scope tenant (the default of kind token_bucket), but the policy identifies no tenant"},
		{"per tenant and operation without a tenant", "version: 1\ngates:\n  - name: a\n    kind: concurrency\n    scope: tenant_operation\n    limit: 1\n", 5, "gates[0].scope", "scope tenant_operation, but the policy identifies no tenant"},
		{"tenant without a source", "version: 1\nidentity:\n  tenant: {required: true}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 3, "identity.tenant", "no source"},
		{"empty claim", "version: 1\nidentity:\n  tenant:\n    claim: \"\"\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.tenant.claim", "empty: want a top-level claim"},
		{"bad CIDR", "version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip:\n    trusted_proxies:\n      - 10.0.0.0/8\n      - 10.0.0.1/8\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 7, "identity.client_ip.trusted_proxies[1]", "did you mean 10.0.0.0/8?"},
		{"peer not a CIDR", "version: 1\nidentity:\n  peers:\n    trusted: [10.0.0.0/8, 10.0.0.1/8]\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.peers.trusted[1]", "did you mean 10.0.0.0/8?"},
		{"peers without trusted", "version: 1\nidentity:\n  peers: {trustd: [10.0.0.0/8]}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 3, "identity.peers.trustd", `did you mean "trusted"?`},
		{"peers empty", "version: 1\nidentity:\n  peers: {}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 3, "identity.peers", "no trusted"},
		{"not a CIDR", "version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip: {trusted_proxies: [10.0.0.0/33]}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.client_ip.trusted_proxies[0]", "is not a CIDR"},
		{"IPv6 prefix out of range", "version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip:\n    ipv6_prefix: 129\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 5, "identity.client_ip.ipv6_prefix", "129 is out of range [1, 128]"},
		{"IPv4 prefix 0", "version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip: {ipv4_prefix: 0}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.client_ip.ipv4_prefix", "0 is out of range [1, 32]"},
		{"forwarded header", "version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip: {header: x-real-ip}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.client_ip.header", "not one of x-forwarded-for, forwarded"},
		{"client_ip without ip", "version: 1\nidentity:\n  tenant: {header: X-Api-Key}\n  client_ip: {trusted_proxies: [10.0.0.0/8]}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.client_ip", "applies only to a tenant keyed by ip"},
		{"token without claim", "version: 1\nidentity:\n  tenant: {header: X-Api-Key}\n  token: {header: X-Jwt}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 4, "identity.token", "applies only to a tenant keyed by a claim"},
		{"query name", "version: 1\nidentity:\n  tenant: {query: \"a&b\"}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", 3, "identity.tenant.query", "not a plain query parameter name"},
		{"bad tenant header", "version: 1\nidentity: {tenant: {header: \"X Api\"}}\ngates:\n  - {name: g, kind: concurrency, limit: 1}\n", 2, "identity.tenant.header", "not a valid header name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.file))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("no policy errors: %v", err)
			}
			if len(es) != 1 {
				t.Fatalf("%d errors, want 1:\n%v", len(es), es)
			}
			e := es[0]
			if e.Line != c.line || e.Field != c.field || !strings.Contains(e.Msg, c.msg) || e.File != "p.yaml" {
				t.Fatalf("got  %v\nwant p.yaml:%d: %s: …%s…", e, c.line, c.field, c.msg)
			}
		})
	}
}

// A route whose every request costs more than a gate admits at once is
// refused forever, a 429 no retry helps: the policy is refused, naming
// the gate's field and the route (check passed it).
func TestCostAboveAGatesCapacityRefused(t *testing.T) {
	for _, c := range []struct {
		route, gate, field string // field "": the policy is valid
	}{
		{"cost: 10", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5}", "gates[0].burst"},
		{"cost: 10", "{name: g, kind: gcra, scope: service, rate: 10/s, burst: 5}", "gates[0].burst"},
		{"cost: 10", "{name: g, kind: fixed_window, scope: service, limit: 5, window: 1s}", "gates[0].limit"},
		{"cost: 10", "{name: g, kind: sliding_log, scope: service, limit: 5, window: 1s}", "gates[0].limit"},
		{"cost: 10", "{name: g, kind: sliding_window, scope: service, limit: 5, window: 1s}", "gates[0].limit"},
		{"cost: 10", "{name: g, kind: concurrency, limit: 5, weighted: true}", "gates[0].limit"},

		{"cost: {response_header: X-Units, min: 6}", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5}", "gates[0].burst"},
		// Valid: the cost fits, a header's minimum fits, the gate counts
		// slots, or applies to another class.
		{"cost: 5", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5}", ""},
		{"cost: {header: X-Units, max: 50}", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5}", ""},
		// Without the header a request costs 1: the route is admitted.
		{"cost: {header: X-Units, min: 6}", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5}", ""},
		{"cost: 10", "{name: g, kind: concurrency, limit: 5}", ""},
		{"cost: 10, class: batch", "{name: g, kind: token_bucket, scope: service, rate: 10/s, burst: 5, classes: [default]}", ""},
	} {
		src := "version: 1\nroutes:\n  - {match: {path: /a}, " + c.route + "}\n  - {match: {path: /b}}\ngates:\n  - " + c.gate + "\n"
		_, err := Parse("p.yaml", []byte(src))
		if c.field == "" {
			if err != nil {
				t.Errorf("%s / %s: %v", c.route, c.gate, err)
			}
			continue
		}
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 || es[0].Field != c.field || es[0].Line != 6 ||
			!strings.Contains(es[0].Msg, "route at line 3") || !strings.Contains(es[0].Msg, "never admits") {
			t.Errorf("%s / %s: %v, want one error in %s naming the route", c.route, c.gate, err, c.field)
		}
	}
}

func TestTooManyGates(t *testing.T) {
	src := "version: 1\ngates:\n"
	for i := range 17 {
		src += fmt.Sprintf("  - {name: g%d, kind: concurrency, limit: 1}\n", i)
	}
	_, err := Parse("p.yaml", []byte(src))
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].Line != 19 || es[0].Field != "gates[16]" {
		t.Fatalf("%v", err)
	}
}

func TestReloadKeepsStateOfUnchangedGates(t *testing.T) {
	clk := fakeclock.New(1)
	f1, _ := Parse("p.yaml", []byte(good))
	rt1, err := Build(f1, nil, Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &sluice.Request{Tenant: "acme"}
	for range 500 {
		_, tk := rt1.Chain.Decide(ctx, req)
		tk.Done(sluice.OutcomeUseful)
	}
	// Change only the concurrency gate.
	f2, _ := Parse("p.yaml", []byte(strings.Replace(good, "limit: 20", "limit: 30", 1)))
	rt2, err := Build(f2, rt1, Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := rt2.Chain.Decide(ctx, req); d.Admitted || d.Gate != "request-rate" {
		t.Fatalf("the unchanged rate gate lost its state: %+v", d)
	}
	if a, ok := sluice.As[sluice.Advertiser](rt2.Chain.Gates()[1]); !ok || a.Policy().Quota != 30 {
		t.Fatalf("changed gate not rebuilt: %+v", rt2.Chain.Gates()[1])
	}
	if p := rt2.Chain.Policies(); len(p) != 1 || p[0].Name != "request-rate" {
		t.Fatalf("advertised %+v: want the per-tenant request-rate alone (inflight is service-wide)", p)
	}
	// A rate change rebuilds the bucket (full again).
	f3, _ := Parse("p.yaml", []byte(strings.Replace(good, "burst: 500", "burst: 600", 1)))
	rt3, _ := Build(f3, rt2, Options{Clock: clk})
	if d, tk := rt3.Chain.Decide(ctx, req); !d.Admitted {
		t.Fatalf("changed gate kept old state: %+v", d)
	} else {
		tk.Done(sluice.OutcomeUseful)
	}
}

func TestClassesFieldLimitsAGateToClasses(t *testing.T) {
	f, err := Parse("m.yaml", example("mercury"))
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New(1)
	rt, _ := Build(f, nil, Options{Clock: clk})
	ctx := context.Background()
	// 2,400 premium units at once, then the premium budget is empty while
	// free traffic still has its own.
	admitted := 0
	for range 900 {
		d, tk := rt.Chain.Decide(ctx, &sluice.Request{Tenant: "p", Class: "critical", Cost: 3})
		if d.Admitted {
			admitted++
			tk.Done(sluice.OutcomeUseful)
		}
	}
	_ = admitted
	d, tk := rt.Chain.Decide(ctx, &sluice.Request{Tenant: "f", Class: "sheddable", Cost: 1})
	if !d.Admitted {
		t.Fatalf("free traffic blocked by the premium budget: %+v", d)
	}
	tk.Done(sluice.OutcomeUseful)
}

func FuzzParse(f *testing.F) {
	f.Add(good)
	f.Add(string(example("routes-api")))
	f.Add(string(example("mercury")))
	f.Add("version: 1\ngates:\n  - {name: a, kind: leaky_bucket, rate: 3/s, queue: 2}\n")
	f.Add("{")
	f.Fuzz(func(t *testing.T, s string) {
		file, err := Parse("fuzz.yaml", []byte(s))
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error without position: %v", err)
			}
			for _, e := range es {
				if e.File != "fuzz.yaml" || e.Field == "" || e.Msg == "" {
					t.Fatalf("incomplete error %+v", e)
				}
			}
			return
		}
		// A file that parses must build and describe itself.
		if _, err := Build(file, nil, Options{}); err != nil {
			t.Fatalf("parsed but does not build: %v\n%s", err, s)
		}
		_ = file.SpecText()
	})
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load("/nonexistent/p.yaml"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// A reload that changes a limit (not what the state means) keeps the
// state: requests in flight still count, and no fresh burst opens.
func TestReloadCarriesStateAcrossLimitChanges(t *testing.T) {
	clk := fakeclock.New(1)
	src := "version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 2, retry_hint: 1s}\n  - {name: rate, kind: token_bucket, scope: service, rate: 1/h, burst: 5}\n"
	f1, _ := Parse("p.yaml", []byte(src))
	rt1, _ := Build(f1, nil, Options{Clock: clk})
	ctx := context.Background()
	_, t1 := rt1.Chain.Decide(ctx, &sluice.Request{})
	_, t2 := rt1.Chain.Decide(ctx, &sluice.Request{})
	edited := strings.NewReplacer("limit: 2, retry_hint: 1s", "limit: 3, retry_hint: 2s", "burst: 5", "burst: 6").Replace(src)
	f2, _ := Parse("p.yaml", []byte(edited))
	rt2, err := Build(f2, rt1, Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	d3, t3 := rt2.Chain.Decide(ctx, &sluice.Request{})
	if !d3.Admitted {
		t.Fatalf("third slot of the new limit 3: %+v", d3)
	}
	if d4, _ := rt2.Chain.Decide(ctx, &sluice.Request{}); d4.Admitted || d4.Gate != "pool" {
		t.Fatalf("in-flight requests of the old chain no longer count: %+v", d4)
	}
	// Tickets of the old chain release into the shared state.
	t1.Done(sluice.OutcomeUseful)
	t2.Done(sluice.OutcomeUseful)
	t3.Done(sluice.OutcomeUseful)
	// The bucket kept its level: 3 of 5 tokens used, burst now 6 → 3 left.
	n := 0
	for range 10 {
		d, tk := rt2.Chain.Decide(ctx, &sluice.Request{})
		if d.Admitted {
			n++
			tk.Done(sluice.OutcomeUseful)
		}
	}
	if n != 3 {
		t.Fatalf("after the reload the bucket admitted %d, want the 3 it had left", n)
	}
}

// Validation never dials: a Redis policy parses with no Redis anywhere.
// Build does not need Redis either: a service restarted during an outage
// starts, and its gates decide by their failure policies until Redis
// answers (here fail_closed: 503 dependency).
func TestValidationNeverDialsAndBuildStartsWithRedisDown(t *testing.T) {
	f, err := Parse("r.yaml", []byte("version: 1\nidentity: {tenant: {header: X-Api-Key}}\nstore: {backend: redis, addrs: [\"127.0.0.1:1\"], timeout: 20ms, on_failure: fail_closed}\ngates:\n  - {name: a, kind: token_bucket, rate: 1/s, burst: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(f); err != nil {
		t.Fatal(err)
	}
	rt, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatalf("Build with Redis down: %v", err)
	}
	defer rt.Close()
	d, _ := rt.Chain.Decide(context.Background(), &sluice.Request{Tenant: "t"})
	if d.Admitted || d.Reason != sluice.ReasonDependency || d.Gate != "a" {
		t.Fatalf("with Redis down: %+v, want the failure policy's rejection", d)
	}
}

// example returns the example policy named name.
func example(name string) []byte {
	data, _, ok := examples.ByName(name)
	if !ok {
		panic("no example " + name)
	}
	return data
}

// A policy with the allocation kinds builds into a chain that decides:
// the reservation, a fair wait queue and the cohort cut.
func TestAllocationKindsBuild(t *testing.T) {
	f, err := Parse("p.yaml", []byte(`version: 1
identity: {tenant: {header: X-Api-Key}}
routes:
  - {match: {path: /premium/*}, class: critical, cost: 3}
  - {match: {path: /free/*}, class: sheddable}
gates:
  - name: shed
    kind: utilization
    workers: 8
    tiers: [sheddable, default, critical]
    cohorts: {count: 64, period: 30s}
  - name: units
    kind: reservation
    capacity: 100
    recovery: 10
    shares:
      critical: {reserve: 60}
      sheddable: {reserve: 30, tenant: 10, borrow: false}
  - name: pool
    kind: concurrency
    limit: 4
    queue: {max_wait: 50ms, classes: [critical, default, sheddable], fair: {weights: {acme: 2}, burst: 3}}
  - name: slots
    kind: reservation
    inflight: 8
    shares: {critical: {reserve: 5}, sheddable: {reserve: 3}}
    queue: {max_wait: 50ms, classes: [critical, default, sheddable]}
`))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	admitted := map[string]int{}
	for i := 0; i < 20; i++ {
		r := &sluice.Request{Tenant: "acme", Class: "sheddable", Cost: 1}
		d, tk := rt.Chain.Decide(context.Background(), r)
		if d.Admitted {
			admitted[d.Gate]++
			tk.Done(sluice.OutcomeUseful)
		} else {
			admitted["rejected by "+d.Gate]++
		}
	}
	// A free tenant's bucket holds 10 units/s × 100 ms = 1 unit: the
	// first passes, the rest of the burst meets the tenant level.
	if admitted["rejected by units"] == 0 {
		t.Errorf("the tenant level never rejected: %v", admitted)
	}
	spec := f.SpecText()
	for _, want := range []string{"units reserves critical 60 units/s", "weighted fair shares of work units", "exact cut over (tier",
		"slots reserves critical 5 units, sheddable 3 units of 8 work units in flight"} {
		if !strings.Contains(spec, want) {
			t.Errorf("spec lacks %q:\n%s", want, spec)
		}
	}
}
