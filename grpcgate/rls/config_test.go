package rls

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/yamlfile"
)

func mustLoad(t testing.TB, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustParse(t testing.TB, text string) *Config {
	t.Helper()
	c, err := Parse("inline.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ents(kv ...string) []Entry {
	out := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

// lookupCase is one descriptor and what the peer resolves it to: no rule
// (rpu < 0), or a limit and the statistics key.
type lookupCase struct {
	entries []Entry
	rpu     int64
	unit    Unit
	stats   string
}

func checkLookups(t *testing.T, c *Config, domain string, cases []lookupCase) {
	t.Helper()
	for _, tc := range cases {
		m, ok := c.domains[domain].lookup(tc.entries)
		if tc.rpu < 0 {
			if ok {
				t.Errorf("%v: matched %v, want no rule", tc.entries, m.rule)
			}
			continue
		}
		if !ok {
			t.Errorf("%v: no rule, want %d/%s", tc.entries, tc.rpu, tc.unit)
			continue
		}
		if int64(m.rule.RequestsPerUnit) != tc.rpu || m.rule.Unit != tc.unit || m.stats != tc.stats {
			t.Errorf("%v: %d/%s stats %q, want %d/%s stats %q", tc.entries, m.rule.RequestsPerUnit, m.rule.Unit, m.stats, tc.rpu, tc.unit, tc.stats)
		}
	}
}

// The vectors of envoyproxy/ratelimit test/config/config_test.go,
// TestBasicConfig, on the same tree (testdata/basic.yaml).
func TestPeerBasicConfigLookups(t *testing.T) {
	c := mustLoad(t, "testdata/basic.yaml")
	checkLookups(t, c, "test-domain", []lookupCase{
		{ents("key1", "something"), -1, 0, ""},
		{ents("key1", "value1"), -1, 0, ""}, // a placeholder without a rule
		{ents("key2", "value2", "subkey", "subvalue"), -1, 0, ""},
		{ents("key5", "value5", "subkey5", "subvalue"), -1, 0, ""},
		{ents("key1", "value1", "subkey1", "something"), 5, Second, "key1_value1.subkey1"},
		{ents("key1", "value1", "subkey1", "subvalue1"), 10, Second, "key1_value1.subkey1_subvalue1"},
		{ents("key2", "something"), 20, Minute, "key2"},
		{ents("key2", "value2"), 30, Minute, "key2_value2"},
		{ents("key2", "value3"), -1, 0, ""}, // whitelisted value
		{ents("key3", "foo"), 1, Hour, "key3"},
		{ents("key4", "foo"), 1, Day, "key4"},
		{ents("key5", "value5"), 15, Day, "key5_value5"},
		{ents("key5", "value5", "subkey5", "subvalue5"), 25, Day, "key5_value5.subkey5_subvalue5"},
		{ents("key7", "unspecified_value"), 70, Minute, "key7_unspecified_value"}, // detailed_metric
		{ents("key7", "another_value"), 70, Minute, "key7_another_value"},
	})
	if r := c.Lookup("test-domain", ents("key4", "foo")); r == nil || r.Name != "key4_rate_limit" {
		t.Errorf("key4: %v, want the rule named key4_rate_limit", r)
	}
	if r := c.Lookup("test-domain", ents("key6", "foo")); r == nil || !r.Unlimited {
		t.Errorf("key6: %v, want unlimited", r)
	}
	if r := c.Lookup("foo_domain", ents("key3", "foo")); r != nil {
		t.Errorf("unknown domain matched %v", r)
	}
}

// TestWildcardConfig of the peer's test/config/config_test.go, on
// testdata/wildcard.yaml: the statistics key keeps the pattern.
func TestPeerWildcardLookups(t *testing.T) {
	c := mustLoad(t, "testdata/wildcard.yaml")
	checkLookups(t, c, "test-domain", []lookupCase{
		{ents("noVal", "foo1"), 20, Minute, "noVal"},
		{ents("noVal", "foo2"), 20, Minute, "noVal"},
		{ents("wild", "foo1"), 20, Minute, "wild_foo*"},
		{ents("wild", "foo2"), 20, Minute, "wild_foo*"},
		{ents("wild", "foo"), 20, Minute, "wild_foo*"}, // '*' matches nothing too
		{ents("nestedWild", "val1", "wild", "goo2"), 20, Minute, "nestedWild_val1.wild_goo*"},
		{ents("wild", "bar"), -1, 0, ""},
		{ents("noWild", "foo1"), -1, 0, ""},
		{ents("midWild", "barab"), 20, Minute, "midWild_bar*b"},
		{ents("midWild", "bar123b"), 20, Minute, "midWild_bar*b"},
		{ents("midWild", "barb"), 20, Minute, "midWild_bar*b"},
		{ents("midWild", "bara"), -1, 0, ""},
		{ents("midWild", "xbarb"), -1, 0, ""},
		{ents("multiWild", "foo123bar456baz"), 10, Minute, "multiWild_foo*bar*baz"},
		{ents("multiWild", "foobarbaz"), 10, Minute, "multiWild_foo*bar*baz"},
		{ents("multiWild", "foo123baz"), -1, 0, ""},
		{ents("multiWild", "bar456baz"), -1, 0, ""},
	})
}

// The statistics keys of the peer's TestShareThreshold and
// TestValueToMetric_* (test/config/config_test.go) and README Examples
// 8, 10 and 11.
func TestPeerStatsKeys(t *testing.T) {
	c := mustLoad(t, "testdata/share.yaml")
	checkLookups(t, c, "test-domain", []lookupCase{
		{ents("files", "files/a.pdf"), 10, Hour, "files_files/*"},
		{ents("route", "api/v1", "method", "GET"), 60, Minute, "route_api/*.method"},
		{ents("file", "test1"), 50, Minute, "file_test1"}, // the exact value first
		{ents("file", "test2"), 100, Minute, "file_test*"},
	})
	c = mustParse(t, `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: "read*"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: service
    value: "svc/*"
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`)
	checkLookups(t, c, "example10", []lookupCase{
		{ents("route", "api", "http_method", "GET", "subject_id", "123"), 60, Minute, "route_api.http_method_GET.subject_id"},
		{ents("user", "alice", "action", "readfile", "resource", "documents"), 100, Minute, "user_alice.action_readfile.resource"},
		{ents("service", "svc/user", "endpoint", "get"), 80, Minute, "service_svc/*.endpoint_get"},
		{ents("key1", "unspecified_value"), 10, Minute, "key1_unspecified_value"},
		{ents("key1", "value1"), 20, Minute, "key1_value1"},
		{ents("key1", ""), 10, Minute, "key1_"}, // the peer's detailed key keeps the underscore
	})
	// README Example 4: a rule applies only at the level of the last entry.
	c = mustParse(t, "domain: example4\ndescriptors:\n  - {key: key, value: value, rate_limit: {requests_per_unit: 300, unit: second}}\n")
	checkLookups(t, c, "example4", []lookupCase{{ents("key", "value", "subkey", "subvalue"), -1, 0, ""}})
	// TestDetailedMetric's first case: a deeper tree, a request of one entry.
	c = mustParse(t, `
domain: nested
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - {key: key-2, rate_limit: {requests_per_unit: 5, unit: minute}}
`)
	checkLookups(t, c, "nested", []lookupCase{
		{ents("key-1", "value-1"), 100, Minute, "key-1_value-1"},
		{ents("key-1", "value-1", "key-2", "value-2"), 5, Minute, "key-1.key-2"},
	})
}

// Each error the peer's loader reports (test/config/*.yaml,
// config_test.go), and the stricter checks of this package, name the
// file, the line and the field.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
	}{
		{"empty_domain", "descriptors:\n", "inline.yaml:1: domain: missing or empty"},
		{"empty_file", "", "empty configuration file"},
		{"empty_key", "domain: d\ndescriptors:\n  - value: value1\n", "inline.yaml:3: descriptors[0].key: missing or empty"},
		{"duplicate_key", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
			`inline.yaml:6: descriptors[1].value: duplicate descriptor "d.key1_value1" at this level (line 3)`},
		{"duplicate_default", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", `duplicate descriptor "d.a"`},
		{"bad_limit_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			`inline.yaml:5: descriptors[0].rate_limit.unit: invalid rate limit unit "foo"`},
		{"bad_yaml", "'''\n", "inline.yaml:2: (yaml):"},
		{"misspelled_key", "domain: d\ndescriptors:\n  - key: key1\n    ratelimit:\n      unit: day\n",
			`inline.yaml:4: descriptors[0].ratelimit: unknown field; did you mean "rate_limit"?`},
		{"misspelled_key2", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			`inline.yaml:6: descriptors[0].rate_limit.requestsperunit: unknown field; did you mean "requests_per_unit"?`},
		{"non_string_key", "0.25: test-domain\ndescriptors:\n", "inline.yaml:1: 0.25: a key must be a string"},
		{"non_map_list", "domain: d\ndescriptors:\n  - a\n  - b\n", `inline.yaml:3: descriptors[0]: want a descriptor`},
		{"replaces_empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
			"descriptors[0].rate_limit.replaces[0].name: should not have an empty replaces entry"},
		{"replaces_self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",
			"replaces should not contain name of same descriptor"},
		{"replaces_unknown", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: specific, unit: second, requests_per_unit: 5}\n  - key: b\n    rate_limit: {replaces: [{name: spesific}], unit: second, requests_per_unit: 5}\n",
			`inline.yaml:6: descriptors[1].rate_limit.replaces[0].name: "spesific" names no rate_limit of domain "d"; did you mean "specific"?`},
		{"unlimited_with_unit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
			"inline.yaml:6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"},
		{"negative_rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "requests_per_unit: -1 is out of range [0, 4294967295]"},
		{"huge_rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", "out of range"},
		{"missing_rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n", "requests_per_unit: missing (write 0 to refuse every request)"},
		{"null_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit, requests_per_unit: 3}\n", `rate_limit.unit: invalid rate limit unit ""`},
		{"missing_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 3}\n", "rate_limit.unit: missing"},
		{"float_rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", `"1.5" is not an integer`},
		{"share_without_wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "share_threshold: applies only to a wildcard value"},
		{"metadata_list", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n", "descriptors[0].metadata: want a mapping"},
		{"duplicate_field", "domain: d\ndomain: e\n", "inline.yaml:2: domain: duplicate field"},
		{"bad_bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", `shadow_mode: want true or false, got "maybe"`},
		{"bad_algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: leaky, unit: second, requests_per_unit: 1}\n", `"leaky" is not an algorithm`},
		{"burst_on_window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n", "burst: applies only to algorithm token_bucket or gcra, not fixed_window"},
		{"bucket_zero", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 0}\n", "must be ≥ 1 for token_bucket"},
		{"concurrency_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency, limit: 3, unit: second}\n", "a concurrency rule holds limit slots and has no unit"},
		{"concurrency_no_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency}\n", "missing: a concurrency rule needs limit"},
		{"unlimited_algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n", "an unlimited rule has no algorithm"},
		{"two_documents", "domain: d\n---\ndomain: e\n", "more than one YAML document"},
		{"tab", "domain: d\ndescriptors:\n\t- key: k\n", "a tab in the indentation"},
		{"not_a_mapping", "- a\n", "(file): want a mapping of fields"},
		{"rate_limit_list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", "rate_limit: want a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("inline.yaml", []byte(tc.text))
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			var es yamlfile.Errors
			if !errors.As(err, &es) {
				t.Errorf("%T is not yamlfile.Errors", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestDuplicateDomain: two files of one domain (the peer's
// duplicate_domain.yaml); a folder is read as one configuration.
func TestLoadFolderAndDuplicateDomain(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: one\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}\n")
	write("b.yml", "domain: two\n")
	write(".hidden.yaml", "not: a config\n")
	write("notes.txt", "ignored\n")
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "one,two" {
		t.Errorf("domains %s, want one,two", got)
	}
	write("c.yaml", "# the same domain again\ndomain: one\ndescriptors:\n")
	_, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:2: domain: duplicate domain "one" (also in `) {
		t.Errorf("duplicate domain: %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml") {
		t.Errorf("empty folder: %v", err)
	}
	// Every file's errors are reported, not only the first file's.
	write("c.yaml", "domain: three\ndescriptors:\n  - value: x\n")
	write("d.yaml", "domain: four\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), "c.yaml:3:") || !strings.Contains(err.Error(), "d.yaml:4:") {
		t.Errorf("errors of two files: %v", err)
	}
}

// The peer reads YAML 1.1 (gopkg.in/yaml.v2): anchors, aliases and merge
// keys, yes/no booleans, units in any case, scalars as strings.
func TestConfigYAMLAsThePeerReadsIt(t *testing.T) {
	c := mustParse(t, `
domain: yaml
descriptors:
  - key: a
    rate_limit: &per_minute
      unit: MINUTE
      requests_per_unit: 0x10
  - key: b
    rate_limit: *per_minute
  - key: c
    rate_limit:
      <<: *per_minute
      requests_per_unit: 1_000
  - key: port
    value: 8080
    shadow_mode: yes
    rate_limit: {unit: Hour, requests_per_unit: 3}
`)
	checkLookups(t, c, "yaml", []lookupCase{
		{ents("a", "x"), 16, Minute, "a"},
		{ents("b", "x"), 16, Minute, "b"},
		{ents("c", "x"), 1000, Minute, "c"},
		{ents("port", "8080"), 3, Hour, "port_8080"},
	})
	if r := c.Lookup("yaml", ents("port", "8080")); !r.ShadowMode {
		t.Error("shadow_mode: yes was not read as true")
	}
	// An alias bomb is refused, not expanded.
	bomb := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h"} {
		bomb += n + ": &" + n + " [" + strings.Repeat("*"+prev+", ", 9) + "*" + prev + "]\n"
		prev = n
	}
	if _, err := Parse("bomb.yaml", []byte(bomb+"domain: d\n")); err == nil {
		t.Error("an alias bomb was accepted")
	}
}

func TestIsConfig(t *testing.T) {
	for text, want := range map[string]bool{
		"domain: d\ndescriptors: []\n":      true,
		"# comment\ndomain: edge\n":         true,
		"version: 1\ngates: []\n":           false,
		"- domain\n":                        false,
		"'''":                               false,
		"":                                  false,
		"service: s\nversion: 1\ndomain: x": true,
	} {
		if got := IsConfig([]byte(text)); got != want {
			t.Errorf("IsConfig(%q) = %v, want %v", text, got, want)
		}
	}
	data, err := os.ReadFile("testdata/basic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !IsConfig(data) {
		t.Error("testdata/basic.yaml is not recognised")
	}
}

func TestExtensionRules(t *testing.T) {
	c := mustLoad(t, "testdata/extensions.yaml")
	for _, tc := range []struct {
		key   string
		alg   string
		burst int64
		limit int64
	}{
		{"api_key", "token_bucket", 20, 0},
		{"tenant", "gcra", 5, 0},
		{"path", "sliding_window", 0, 0},
		{"upload", "concurrency", 0, 2},
		{"login", "sliding_log", 0, 0},
	} {
		r := c.Lookup("ext", ents(tc.key, "x"))
		if r == nil || r.Algorithm != tc.alg || r.Burst != tc.burst || r.Limit != tc.limit {
			t.Errorf("%s: %+v", tc.key, r)
		}
	}
	c = mustParse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 7}}\n")
	if r := c.Lookup("d", ents("k", "")); r.Burst != 7 {
		t.Errorf("default burst %d, want requests_per_unit 7", r.Burst)
	}
}
