package rls

import (
	"testing"
)

const (
	mHits   = "sluice_rls_total_hits_total"
	mOver   = "sluice_rls_over_limit_total"
	mNear   = "sluice_rls_near_limit_total"
	mWithin = "sluice_rls_within_limit_total"
	mShadow = "sluice_rls_shadow_mode_total"
)

// scenario is one documented behaviour of envoyproxy/ratelimit, as a
// sequence of calls on a configuration and the answers the peer gives.
type scenario struct {
	name   string
	source string // where the peer states or tests it
	config string // a testdata file, or inline YAML
	domain string
	opts   Options
	calls  []call
}

func (sc scenario) load(t *testing.T) *Config {
	if len(sc.config) < 64 && !containsNewline(sc.config) {
		return mustLoad(t, sc.config)
	}
	return mustParse(t, sc.config)
}

func containsNewline(s string) bool {
	for i := range len(s) {
		if s[i] == '\n' {
			return true
		}
	}
	return false
}

const cacheVectors = `
domain: domain
descriptors:
  - {key: key, value: value, rate_limit: {unit: second, requests_per_unit: 10}}
  - key: key2
    value: value2
    descriptors:
      - {key: subkey2, value: subvalue2, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - {key: subkey3, value: subvalue3, rate_limit: {unit: day, requests_per_unit: 10}}
  - {key: key4, value: value4, rate_limit: {unit: hour, requests_per_unit: 15}}
  - {key: key9, value: value9, rate_limit: {unit: second, requests_per_unit: 20}}
  - {key: key10, value: value10, rate_limit: {unit: second, requests_per_unit: 10}}
`

const serviceVectors = `
domain: different-domain
descriptors:
  - {key: foo, value: bar, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: baz, value: qux, rate_limit: {unlimited: true}}
  - {key: tight, rate_limit: {name: tight_limit, unit: minute, requests_per_unit: 3}}
`

// peerScenarios reproduce envoyproxy/ratelimit decision by decision: its
// tests' vectors (the fake clock at their instants, the counts they mock
// built up by real calls) and its README's examples. The README's
// compatibility table lists them by name.
var peerScenarios = []scenario{
	{
		name:   "window_remaining",
		source: "test/redis/fixed_cache_impl_test.go TestRedis: 10/SECOND at t=1234, the count at 5 leaves 5",
		config: cacheVectors, domain: "domain",
		calls: []call{{at: 1234, repeat: 4, descs: []Descriptor{d("key", "value")}, overall: CodeOK,
			want:  []ws{ok(10, Second, 5, 1)},
			stats: []stat{st(mHits, "key_value", 5), st(mWithin, "key_value", 5), st(mOver, "key_value", 0), st(mNear, "key_value", 0)}}},
	},
	{
		name:   "window_over_and_peek",
		source: "test/redis/fixed_cache_impl_test.go TestRedis: the 11th hit of 10/MINUTE is over; hits_addend 0 only reads",
		config: cacheVectors, domain: "domain",
		calls: []call{
			{at: 1234, repeat: 9, descs: []Descriptor{dh(0, "key2", "value2"), dh(1, "key2", "value2", "subkey2", "subvalue2")}, overall: CodeOK,
				want: []ws{noLimit, ok(10, Minute, 0, 26)}},
			{descs: []Descriptor{dh(0, "key2", "value2"), dh(1, "key2", "value2", "subkey2", "subvalue2")}, overall: CodeOverLimit,
				want:  []ws{noLimit, over(10, Minute, 26)},
				stats: []stat{st(mHits, "key2_value2.subkey2_subvalue2", 11), st(mOver, "key2_value2.subkey2_subvalue2", 1), st(mWithin, "key2_value2.subkey2_subvalue2", 10)}},
			// t=1000000: the hour window starts at 997200, the day window at 950400.
			{at: 1_000_000, repeat: 11, descs: []Descriptor{dh(1, "key3", "value3"), dh(1, "key3", "value3", "subkey3", "subvalue3")}, overall: CodeOverLimit,
				want: []ws{over(10, Hour, 800), over(10, Day, 36800)}},
			{descs: []Descriptor{dh(0, "key3", "value3"), dh(1, "key3", "value3", "subkey3", "subvalue3")}, overall: CodeOverLimit,
				want: []ws{over(10, Hour, 800), over(10, Day, 36800)},
				// the peek (hits 0) of an over window counts no hit and no over_limit
				stats: []stat{st(mHits, "key3_value3", 12), st(mOver, "key3_value3", 2), st(mHits, "key3_value3.subkey3_subvalue3", 13), st(mOver, "key3_value3.subkey3_subvalue3", 3)}},
		},
	},
	{
		name:   "near_limit",
		source: "test/redis/fixed_cache_impl_test.go TestNearLimit: 15/HOUR near from ⌊15·0.8⌋ = 12; 20/SECOND, 15 then 7 hits: 2 over, 4 near",
		config: cacheVectors, domain: "domain",
		calls: []call{
			{at: 1_000_000, repeat: 10, descs: []Descriptor{d("key4", "value4")}, overall: CodeOK, want: []ws{ok(15, Hour, 4, 800)},
				stats: []stat{st(mNear, "key4_value4", 0), st(mWithin, "key4_value4", 11)}},
			{repeat: 1, descs: []Descriptor{d("key4", "value4")}, overall: CodeOK, want: []ws{ok(15, Hour, 2, 800)},
				stats: []stat{st(mNear, "key4_value4", 1), st(mWithin, "key4_value4", 13)}},
			{repeat: 2, descs: []Descriptor{d("key4", "value4")}, overall: CodeOverLimit, want: []ws{over(15, Hour, 800)},
				stats: []stat{st(mNear, "key4_value4", 3), st(mOver, "key4_value4", 1), st(mWithin, "key4_value4", 15)}},
			{at: 1234, hits: 15, descs: []Descriptor{d("key9", "value9")}, overall: CodeOK, want: []ws{ok(20, Second, 5, 1)}},
			{hits: 7, descs: []Descriptor{d("key9", "value9")}, overall: CodeOverLimit, want: []ws{over(20, Second, 1)},
				stats: []stat{st(mHits, "key9_value9", 22), st(mOver, "key9_value9", 2), st(mNear, "key9_value9", 4), st(mWithin, "key9_value9", 15)}},
			// all over: every hit of a call that starts over the limit
			{hits: 27, descs: []Descriptor{d("key10", "value10")}, overall: CodeOverLimit, want: []ws{over(10, Second, 1)},
				stats: []stat{st(mOver, "key10_value10", 17), st(mNear, "key10_value10", 2)}},
			{hits: 3, descs: []Descriptor{d("key10", "value10")}, overall: CodeOverLimit, want: []ws{over(10, Second, 1)},
				stats: []stat{st(mOver, "key10_value10", 20), st(mNear, "key10_value10", 2), st(mWithin, "key10_value10", 0)}},
			// the next second is a new window
			{at: 1235, descs: []Descriptor{d("key10", "value10")}, overall: CodeOK, want: []ws{ok(10, Second, 9, 1)}},
		},
	},
	{
		name:   "rejected_hits_count",
		source: "src/redis/fixed_cache_impl.go: INCRBY runs for every call, so hits over the limit stay counted in the window",
		config: cacheVectors, domain: "domain",
		calls: []call{
			{at: 1234, hits: 8, descs: []Descriptor{d("key10", "value10")}, overall: CodeOK, want: []ws{ok(10, Second, 2, 1)}},
			{hits: 5, descs: []Descriptor{d("key10", "value10")}, overall: CodeOverLimit, want: []ws{over(10, Second, 1)}},
			// 13 counted: one more hit is over, though 8 + 1 would fit
			{hits: 1, descs: []Descriptor{d("key10", "value10")}, overall: CodeOverLimit, want: []ws{over(10, Second, 1)}},
		},
	},
	{
		name:   "window_boundary",
		source: "src/utils/utilities.go CalculateReset: unit − now mod unit; keys per aligned window (src/limiter/cache_key.go)",
		config: "domain: b\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 3}}\n  - {key: y, rate_limit: {unit: year, requests_per_unit: 1}}\n  - {key: mo, rate_limit: {unit: month, requests_per_unit: 1}}\n",
		domain: "b",
		calls: []call{
			{at: 1199, descs: []Descriptor{d("k", "v")}, overall: CodeOK, want: []ws{ok(3, Minute, 2, 1)}}, // 1199 mod 60 = 59
			{repeat: 2, descs: []Descriptor{d("k", "v")}, overall: CodeOverLimit, want: []ws{over(3, Minute, 1)}},
			{at: 1200, descs: []Descriptor{d("k", "v")}, overall: CodeOK, want: []ws{ok(3, Minute, 2, 60)}}, // rollover
			{at: 1259, repeat: 2, descs: []Descriptor{d("k", "v")}, overall: CodeOverLimit, want: []ws{over(3, Minute, 1)}},
			// a year is 365 days, a month 30, both from the Unix epoch
			{at: 2*31_536_000 - 1, descs: []Descriptor{d("y", "v"), d("mo", "v")}, overall: CodeOK, want: []ws{ok(1, Year, 0, 1), ok(1, Month, 0, 2_592_000-(2*31_536_000-1)%2_592_000)}},
			{at: 2 * 31_536_000, descs: []Descriptor{d("y", "v")}, overall: CodeOK, want: []ws{ok(1, Year, 0, 31_536_000)}},
		},
	},
	{
		name:   "headers_peer",
		source: "test/service/ratelimit_test.go TestServiceWithDefaultRatelimitHeaders: 10/MINUTE over at t=2222, RateLimit-Reset 58",
		config: serviceVectors, domain: "different-domain", opts: Options{Headers: HeadersPeer},
		calls: []call{{at: 2222, repeat: 10, descs: []Descriptor{d("foo", "bar"), d("hello", "world")}, overall: CodeOverLimit,
			want:    []ws{over(10, Minute, 58), noLimit},
			headers: []Header{{"RateLimit-Limit", "10"}, {"RateLimit-Remaining", "0"}, {"RateLimit-Reset", "58"}}}},
	},
	{
		name:   "headers_custom_names",
		source: "test/service/ratelimit_test.go TestServiceWithCustomRatelimitHeaders (LIMIT_LIMIT_HEADER and the others)",
		config: serviceVectors, domain: "different-domain",
		opts: Options{Headers: HeadersPeer, LimitHeader: "A-Ratelimit-Limit", RemainingHeader: "A-Ratelimit-Remaining", ResetHeader: "A-Ratelimit-Reset"},
		calls: []call{{at: 2222, repeat: 10, descs: []Descriptor{d("foo", "bar"), d("hello", "world")}, overall: CodeOverLimit,
			want:    []ws{over(10, Minute, 58), noLimit},
			headers: []Header{{"A-Ratelimit-Limit", "10"}, {"A-Ratelimit-Remaining", "0"}, {"A-Ratelimit-Reset", "58"}}}},
	},
	{
		name:   "headers_most_constrained",
		source: "src/service/ratelimit.go: the headers describe the descriptor with the least remaining (an over-limit one first)",
		config: serviceVectors, domain: "different-domain", opts: Options{Headers: HeadersDraft},
		calls: []call{
			{at: 2222, descs: []Descriptor{d("foo", "bar"), d("tight", "x"), d("baz", "qux")}, overall: CodeOK,
				want:    []ws{ok(10, Minute, 9, 58), {code: CodeOK, rpu: 3, unit: Minute, remaining: 2, reset: 58, name: "tight_limit"}, unlimited},
				headers: []Header{{"RateLimit-Policy", `"tight_limit";q=3;w=60`}, {"RateLimit", `"tight_limit";r=2;t=58`}}},
			{repeat: 9, descs: []Descriptor{d("foo", "bar")}, overall: CodeOverLimit, want: []ws{over(10, Minute, 58)},
				headers: []Header{{"RateLimit-Policy", `"foo_bar";q=10;w=60`}, {"RateLimit", `"foo_bar";r=0;t=58`}}},
		},
	},
	{
		name:   "unlimited",
		source: "test/service/ratelimit_test.go TestUnlimited; README Example 5: OK with limit_remaining MaxUint32, never counted",
		config: serviceVectors, domain: "different-domain",
		calls: []call{{at: 2222, descs: []Descriptor{d("foo", "bar"), d("hello", "world"), d("baz", "qux")}, overall: CodeOK,
			want:  []ws{ok(10, Minute, 9, 58), noLimit, unlimited},
			stats: []stat{st(mHits, "foo_bar", 1), st(mHits, "baz_qux", 0)}}},
	},
	{
		name:   "unknown_domain",
		source: "src/config/config_impl.go GetLimit: an unknown domain matches nothing (domain_not_found), even with an override",
		config: serviceVectors, domain: "no-such-domain",
		calls: []call{{at: 2222, descs: []Descriptor{d("foo", "bar"), dover(1, Minute, "foo", "bar")}, overall: CodeOK,
			want: []ws{noLimit, noLimit}}},
	},
	{
		name:   "shadow_rule",
		source: "test/service/ratelimit_test.go TestRuleShadowMode, TestMixedRuleShadowMode; src/limiter/base_limiter.go: OK, counted, shadow_mode stat",
		config: "testdata/shadow.yaml", domain: "test-domain",
		calls: []call{
			{at: 2222, repeat: 20, descs: []Descriptor{d("key2", "something")}, overall: CodeOK,
				want:  []ws{ok(20, Minute, 0, 58)},
				stats: []stat{st(mHits, "key2", 21), st(mOver, "key2", 1), st(mShadow, "key2", 1)}},
			{repeat: 30, descs: []Descriptor{d("key2", "something"), d("key2", "value2")}, overall: CodeOverLimit,
				want:  []ws{ok(20, Minute, 0, 58), over(30, Minute, 58)},
				stats: []stat{st(mShadow, "key2", 32), st(mShadow, "key2_value2", 0), st(mOver, "key2_value2", 1)}},
		},
	},
	{
		name:   "shadow_global",
		source: "test/service/ratelimit_test.go TestServiceGlobalShadowMode (SHADOW_MODE): overall OK, statuses unchanged",
		config: serviceVectors, domain: "different-domain", opts: Options{ShadowMode: true},
		calls: []call{{at: 2222, repeat: 10, descs: []Descriptor{d("foo", "bar"), d("hello", "world")}, overall: CodeOK,
			want: []ws{over(10, Minute, 58), noLimit}}},
	},
	{
		name:   "replaces",
		source: "README Example 7: (key_1, value_1), (user, bkthomps) 5/s; replaced by the 10/s rule when both match",
		config: "testdata/replaces.yaml", domain: "example7",
		calls: []call{
			{at: 2222, repeat: 4, descs: []Descriptor{d("key_1", "value_1", "user", "bkthomps")}, overall: CodeOK,
				want: []ws{{code: CodeOK, rpu: 5, unit: Second, remaining: 0, reset: 1, name: "specific_limit"}}},
			{descs: []Descriptor{d("key_1", "value_1", "user", "bkthomps")}, overall: CodeOverLimit,
				want: []ws{{code: CodeOverLimit, rpu: 5, unit: Second, reset: 1, name: "specific_limit"}}},
			// both match: the replaced one is not evaluated (and its count unchanged)
			{repeat: 9, descs: []Descriptor{d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps")}, overall: CodeOK,
				want:  []ws{noLimit, ok(10, Second, 0, 1)},
				stats: []stat{st(mHits, "key_1_value_1.user_bkthomps", 6)}},
			{at: 2223, descs: []Descriptor{d("key_1", "value_1", "user", "bkthomps")}, overall: CodeOK,
				want: []ws{{code: CodeOK, rpu: 5, unit: Second, remaining: 4, reset: 1, name: "specific_limit"}}},
		},
	},
	{
		name:   "override",
		source: "test/config/config_test.go TestConfigLimitOverride: the descriptor's limit replaces the rule; stats by key_value",
		config: "testdata/basic.yaml", domain: "test-domain",
		calls: []call{
			{at: 2222, repeat: 2, descs: []Descriptor{dover(3, Minute, "key1", "value1", "subkey1", "something")}, overall: CodeOK,
				want: []ws{ok(3, Minute, 0, 58)}},
			{descs: []Descriptor{dover(3, Minute, "key1", "value1", "subkey1", "something")}, overall: CodeOverLimit,
				want:  []ws{over(3, Minute, 58)},
				stats: []stat{st(mHits, "key1_value1.subkey1_something", 4), st(mOver, "key1_value1.subkey1_something", 1)}},
			// the same counter under a higher override; unmatched descriptors take overrides too
			{descs: []Descriptor{dover(42, Minute, "key1", "value1", "subkey1", "something"), dover(10, Day, "nothing", "here")}, overall: CodeOK,
				want:  []ws{ok(42, Minute, 37, 58), ok(10, Day, 9, 86400-2222)},
				stats: []stat{st(mHits, "key1_value1.subkey1_something", 5), st(mHits, "nothing_here", 1)}},
		},
	},
	{
		name:   "quota_mode",
		source: "test/service/ratelimit_test.go TestServicePerDescriptorQuotaMode, TestServiceQuotaModeOnly*: over only when every quota descriptor is",
		config: "domain: quota-domain\ndescriptors:\n  - {key: regular, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: quota, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}\n  - {key: quota2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
		domain: "quota-domain",
		calls: []call{
			// the only quota descriptor is over: every quota descriptor is
			{at: 2222, repeat: 3, descs: []Descriptor{d("regular", "limit"), d("quota", "limit")}, overall: CodeOverLimit,
				want: []ws{ok(5, Minute, 1, 58), over(3, Minute, 58)}},
			// some quota descriptors over: OK
			{descs: []Descriptor{d("quota2", "a"), d("quota", "limit")}, overall: CodeOK,
				want: []ws{ok(1, Minute, 0, 58), over(3, Minute, 58)}},
			{descs: []Descriptor{d("quota2", "a"), d("quota", "limit")}, overall: CodeOverLimit,
				want: []ws{over(1, Minute, 58), over(3, Minute, 58)}},
			{descs: []Descriptor{d("regular", "limit"), d("quota2", "b")}, overall: CodeOK,
				want: []ws{ok(5, Minute, 0, 58), ok(1, Minute, 0, 58)}},
			// a descriptor not in quota mode over: over
			{descs: []Descriptor{d("regular", "limit"), d("quota2", "b")}, overall: CodeOverLimit,
				want: []ws{over(5, Minute, 58), over(1, Minute, 58)}},
		},
	},
	{
		name:   "nested",
		source: "README Example 2: marketing messages 5/day per number, 100/day per number overall, in one call",
		config: "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - {key: to_number, rate_limit: {unit: day, requests_per_unit: 5}}\n  - {key: to_number, rate_limit: {unit: day, requests_per_unit: 100}}\n",
		domain: "messaging",
		calls: []call{
			{at: 86400, repeat: 4, descs: []Descriptor{d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")}, overall: CodeOK,
				want: []ws{ok(5, Day, 0, 86400), ok(100, Day, 95, 86400)}},
			{descs: []Descriptor{d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")}, overall: CodeOverLimit,
				want: []ws{over(5, Day, 86400), ok(100, Day, 94, 86400)}},
			// another number has its own count
			{descs: []Descriptor{d("message_type", "marketing", "to_number", "2062222222")}, overall: CodeOK,
				want: []ws{ok(5, Day, 4, 86400)}},
			// README Example 3: key and value before the key alone
			{descs: []Descriptor{d("message_type", "other", "to_number", "2061111111")}, overall: CodeOK, want: []ws{noLimit}},
		},
	},
	{
		name:   "wildcard_thresholds",
		source: "README Example 11, test/config/share_threshold.yaml: wildcard values isolated per value, or one count with share_threshold",
		config: "testdata/share.yaml", domain: "test-domain",
		calls: []call{
			{at: 3600, repeat: 4, descs: []Descriptor{d("files", "files/a.pdf")}, overall: CodeOK, want: []ws{ok(10, Hour, 5, 3600)}},
			{repeat: 4, descs: []Descriptor{d("files", "files/b.csv")}, overall: CodeOK, want: []ws{ok(10, Hour, 0, 3600)}},
			{descs: []Descriptor{d("files", "files/c.txt")}, overall: CodeOverLimit, want: []ws{over(10, Hour, 3600)}},
			{repeat: 10, descs: []Descriptor{d("files_no_share", "files_no_share/a.pdf")}, overall: CodeOverLimit, want: []ws{over(10, Hour, 3600)}},
			{descs: []Descriptor{d("files_no_share", "files_no_share/b.csv")}, overall: CodeOK, want: []ws{ok(10, Hour, 9, 3600)}},
		},
	},
	{
		name:   "hits_addend",
		source: "src/utils/utilities.go GetHitsAddends: a descriptor's own hits if set (0: check only), else max(1, the request's)",
		config: serviceVectors, domain: "different-domain",
		calls: []call{
			{at: 2222, hits: 0, descs: []Descriptor{d("foo", "bar")}, overall: CodeOK, want: []ws{ok(10, Minute, 9, 58)}},
			{hits: 5, descs: []Descriptor{d("foo", "bar")}, overall: CodeOK, want: []ws{ok(10, Minute, 4, 58)}},
			{hits: 5, descs: []Descriptor{dh(0, "foo", "bar")}, overall: CodeOK, want: []ws{ok(10, Minute, 4, 58)}},
			{hits: 1, descs: []Descriptor{dh(4, "foo", "bar"), d("tight", "t")}, overall: CodeOK,
				want: []ws{ok(10, Minute, 0, 58), {code: CodeOK, rpu: 3, unit: Minute, remaining: 2, reset: 58, name: "tight_limit"}}},
			// at the limit a check is still OK; the next hit is over
			{descs: []Descriptor{dh(0, "foo", "bar")}, overall: CodeOK, want: []ws{ok(10, Minute, 0, 58)}},
			{descs: []Descriptor{d("foo", "bar")}, overall: CodeOverLimit, want: []ws{over(10, Minute, 58)}},
		},
	},
}

// TestPeerCompatibility runs every scenario on memory, Redis and Redis
// Cluster: the same answers, decision by decision.
func TestPeerCompatibility(t *testing.T) {
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			for _, sc := range peerScenarios {
				t.Run(sc.name, func(t *testing.T) {
					s, clk := b.server(t, sc.load(t), sc.opts)
					run(t, s, clk, sc.domain, sc.calls)
				})
			}
		})
	}
}
