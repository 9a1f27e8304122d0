package policy

import (
	"strconv"
	"strings"

	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// key documents one key of a policy file outside the gates: its type,
// default, meaning (with its unit) and an example value. The parser reads
// the keys of each mapping from this table (keysOf), so no key is parsed
// without its documentation, and the reference (Reference) is generated
// from it; TestSchemaExamplesParse parses a file made of every example.
type key struct {
	key     string
	typ     string
	def     string // "required", a default, or "none"
	doc     string
	example string // a value as written in a file (a mapping's comes from its keys)
	sub     []key  // the keys of a mapping, or of each item of a list of mappings
	// commented: the example file writes it as a comment (its value names
	// a file, or it excludes another key).
	commented bool
}

// schema is every key of a policy file but the gates' own (which the
// gate-kind registry documents).
var schema = []key{
	{key: "version", typ: "integer", def: "required", doc: "the schema version; only 1 exists", example: "1"},
	{key: "service", typ: "string", def: "none", doc: "names the protected service in the spec, metrics and Redis keys: lowercase letters, digits, '.', '_' and '-', at most 64", example: "routes-api"},
	{key: "spec", typ: "mapping", def: "none", doc: "the parts of the admission policy spec (printed by sluice check) that the file cannot derive", sub: []key{
		{key: "operation", typ: "string", def: "none", doc: "the protected operation and what a useful completion of it is", example: "route solves answered before the caller's deadline"},
		{key: "resource", typ: "string", def: "none", doc: "the scarce resource, the evidence of its capacity and its safe operating region", example: "the upstream's 8 workers; safe below 80% busy"},
		{key: "owner", typ: "string", def: "none", doc: "who reviews the policy", example: "routes-api on-call"},
	}},
	{key: "store", typ: "mapping", def: "backend: memory", doc: "where the gates' state lives", sub: []key{
		{key: "backend", typ: "memory or redis", def: BackendMemory, doc: "memory: in this process; redis: shared by the fleet (Redis or Redis Cluster)", example: "redis"},
		{key: "addrs", typ: "list of host:port", def: "required on redis", doc: "redis: the addresses of a server or of some nodes of a cluster", example: `["127.0.0.1:6379"]`},
		{key: "cluster", typ: "boolean", def: "false", doc: "redis: says that addrs are cluster nodes (the topology is discovered either way)", example: "false"},
		{key: "timeout", typ: "duration", def: sredis.DefaultTimeout.String(), doc: "redis: Redis does nothing with a call it reaches later than this after its sending (at least 1µs); a call waits as long again for a reply Redis sent in time, so it gives up after twice this", example: "20ms"},
		{key: "on_failure", typ: spellings[gate.FailurePolicy](), def: gate.FailOpen.String(), doc: "what the gates decide while the store fails, unless a gate says otherwise (local_fallback: each replica enforces limit ÷ replicas in memory, kept in step with Redis for the rate kinds: what Redis admits is taken from the replica's share too, and what the share of a token bucket or GCRA admits in an outage is charged to Redis when it answers again, so a Redis that fails and recovers again and again grants one process no fresh burst (a fleet whose load is uneven still can: docs/library.md); on the memory store it means fail_open). fail_open opens only once the store has answered: until then (a start-up while Redis is unreachable or slow) each replica enforces limit ÷ replicas as local_fallback does", example: "local_fallback"},
		{key: "max_keys", typ: "integer in [1, 2^30]", def: strconv.Itoa(memory.DefaultMaxKeys), doc: "memory: about how many keys (tenants) each gate holds; past it, keys in their fresh state are dropped first, then the longest idle of a sample", example: "100000"},
		{key: "replicas", typ: "integer in [1, 100000]", def: "1", doc: "redis: the fleet's size, by which local_fallback divides each limit", example: "4"},
		{key: "probe_every", typ: "duration", def: sredis.DefaultProbeEvery.String(), doc: "redis: how often an open breaker probes the store (at least 10ms)", example: "500ms"},
		{key: "username", typ: "string", def: "none: the default user", doc: "redis: the ACL user the connections authenticate as (Redis 6 and later), with password_env or password_file", example: "sluice"},
		{key: "password_env", typ: "environment variable name", def: "none", doc: "redis: the environment variable holding the password (AUTH; the default user's requirepass, or username's), read when the file is loaded; the password is never logged. A wrong one fails the load, naming Redis' answer", example: "REDIS_PASSWORD"},
		{key: "password_file", typ: "path", def: "none", doc: "redis: instead of password_env, a file holding the password (a final newline dropped), as a mounted secret: read at each load, so SIGHUP takes a rotated one even when the policy file is unchanged (the file watcher sees only the policy file). Relative to the policy file's directory. The secrets and TLS files are read by sluice check too: check where they are", example: "/run/secrets/redis-password", commented: true},
		{key: "tls", typ: "mapping", def: "none: plain TCP", doc: "redis: connect over TLS (1.2 at least), verifying the server's certificate; `tls: {}` trusts the system's roots. The files are read at each load; relative paths are from the policy file's directory", sub: []key{
			{key: "ca_file", typ: "path", def: "the system's roots", doc: "PEM certificates of the CAs that sign the server's", example: "/etc/redis/ca.pem", commented: true},
			{key: "server_name", typ: "string", def: "each address's host", doc: "the name the server's certificate must hold", example: "redis.internal"},
			{key: "cert_file", typ: "path", def: "none", doc: "a client certificate (PEM), for a server that asks for one (tls-auth-clients); with key_file", example: "/etc/sluice/redis-client.pem", commented: true},
			{key: "key_file", typ: "path", def: "none", doc: "the client certificate's private key (PEM)", example: "/etc/sluice/redis-client.key", commented: true},
		}},
	}},
	{key: "identity", typ: "mapping", def: "one anonymous tenant, no deadline", doc: "how requests are identified: server-side rules only, a client never picks its class", sub: []key{
		{key: "tenant", typ: "mapping", def: "none: one anonymous tenant", doc: "the tenant key, a state key (never logged): one or more parts, combined in the order header, query, claim, ip, route; gates of scope tenant need one", sub: []key{
			{key: "header", typ: "header name", def: "none", doc: "the value of this request header (visible ASCII, at most 256 bytes; two fields are a 400)", example: "X-Api-Key"},
			{key: "query", typ: "string", def: "none", doc: "the decoded value of this query parameter (visible ASCII, at most 256 bytes; a repeated parameter is a 400: the upstream might read another one)", example: "api_key"},
			{key: "claim", typ: "string", def: "none", doc: "this top-level claim (a string or a number) of the JWT bearer token (see token). The signature is NOT verified: the token must have been verified by an authenticator in front of sluice (an API gateway, Envoy's jwt_authn); in front of one, a client could pick any key", example: "sub"},
			{key: "ip", typ: "boolean", def: "false", doc: "the client's IP address (see client_ip), grouped by prefix", example: "true"},
			{key: "route", typ: "boolean", def: "false", doc: "the matched route's operation (\"POST /v1/routes\", or \"other\"), e.g. with ip: a limit per client and route", example: "true"},
			{key: "required", typ: "boolean", def: "false", doc: "a request lacking a part (no header, parameter, token, claim or IP address) is a 400; otherwise a missing part is the empty value", example: "true"},
		}},
		{key: "client_ip", typ: "mapping", def: "the peer's address", doc: "how the ip part, and gates of scope client, find the client: only with tenant.ip or a gate of scope client", sub: []key{
			{key: "trusted_proxies", typ: "list of CIDRs or addresses", def: "none: forwarding headers are never read", doc: "peers whose forwarding header is believed. From one, the client is the right-most address of the header that is not itself trusted; from any other peer, the peer itself, whatever it sends. A CIDR with host bits set is refused; IPv4-mapped IPv6 counts as IPv4", example: `[10.0.0.0/8, "2001:db8::/32"]`},
			{key: "header", typ: "x-forwarded-for or forwarded", def: identify.XForwardedFor.String(), doc: "the header the trusted proxies append to: X-Forwarded-For, or RFC 7239 Forwarded (for= nodes). Only this one is read", example: "x-forwarded-for"},
			{key: "ipv4_prefix", typ: "integer in [1, 32]", def: "32", doc: "IPv4 clients in one /prefix share a key", example: "32"},
			{key: "ipv6_prefix", typ: "integer in [1, 128]", def: "64", doc: "IPv6 clients in one /prefix share a key (a host usually holds a whole /64)", example: "64"},
		}},
		{key: "peers", typ: "mapping", def: "none: a class header is never read", doc: "other sluice instances in front of services that call this one (a fan-out behind its own sluice), which set the class they admitted the caller's request as on the call (Sluice-Class). From a trusted peer that class lowers the route's class, never raises it: a call is worth no more than the request it serves; a class the order lacks counts as its last. From any other peer the header is ignored, and sluice proxy strips it", sub: []key{
			{key: "trusted", typ: "list of CIDRs or addresses", def: "required", doc: "the peers' addresses (as trusted_proxies reads them); put only sluice instances here: a client listed could lower, never raise, its own class", example: `[10.0.0.0/8]`},
		}},
		{key: "token", typ: "mapping", def: "header: Authorization", doc: "where the claim part finds the JWT: only with tenant.claim", sub: []key{
			{key: "header", typ: "header name", def: identify.DefaultTokenHeader, doc: "the header holding the token: Authorization holds \"Bearer TOKEN\"; another (one an authenticator sets, e.g. X-Jwt-Assertion) the token itself", example: "Authorization"},
		}},
		{key: "deadline", typ: "mapping", def: "none", doc: "the caller's time budget, which bounds the work and tells useful from late", sub: []key{
			{key: "header", typ: "header name", def: "none", doc: "header with the remaining budget as a Go duration (250ms)", example: "X-Request-Timeout"},
			{key: "max", typ: "duration", def: identify.DefaultMaxDeadline.String(), doc: "longer budgets are cut to this (at least 1ms)", example: "30s"},
			{key: "default", typ: "duration", def: "none", doc: "the budget of requests without the header (at least 1ms)", example: "10s"},
		}},
		{key: "request_id", typ: "mapping", def: "header: " + identify.DefaultRequestIDHeader, doc: "the request id echoed in rejections", sub: []key{
			{key: "header", typ: "header name", def: identify.DefaultRequestIDHeader, doc: "header the id is read from and echoed in (1 to 64 of a-z A-Z 0-9 - _ . :)", example: "X-Request-Id"},
		}},
		{key: "path_match", typ: "lenient or exact", def: identify.PathLenient.String(), doc: "lenient: dot segments resolved, duplicate and trailing slashes ignored, ASCII case ignored (as most routers do); exact: as written", example: "lenient"},
	}},
	{key: "routes", typ: "list of mappings", def: "none: every request is class default, operation other, cost 1", doc: "server-side class and cost by method and path; the first match wins", sub: []key{
		{key: "match", typ: "mapping", def: "required", doc: "which requests the route is for", sub: []key{
			{key: "method", typ: "GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS", def: "any", doc: "the request method", example: "POST"},
			{key: "path", typ: "path pattern", def: "required", doc: "an exact path, or segments where * is one segment and a final * one or more; no query or fragment", example: "/v1/routes/*"},
		}},
		{key: "class", typ: "class name", def: "default", doc: "the server-authorized priority of matching requests (a-z, 0-9, '_', '-')", example: "critical"},
		{key: "cost", typ: "integer, or mapping", def: "1", doc: "demand units of a matching request, in [1, 2^40]: a fixed number, or read from a header", sub: []key{
			{key: "header", typ: "header name", def: "required in a mapping without response_header", doc: "header with a non-negative integer; the cost is ⌈value ÷ per⌉ clamped to [min, max]; a malformed value is a 400", example: "X-Stops"},
			{key: "response_header", typ: "header name", def: "none", doc: "the upstream's answer's header with the work's actual cost, as the same quantity header declares (⌈value ÷ per⌉ clamped to [min, max]; without header the estimate charged at admission is min): the rate gates (token_bucket, gcra, fixed_window, sliding_window) charge the difference from the estimate to the same keys when the work ends, or give it back, never past an empty quota, so a tenant that under-declares pays in its next requests. A missing or malformed value keeps the estimate", example: "X-Work-Units"},
			{key: "per", typ: "integer", def: "1", doc: "header value per demand unit", example: "100"},
			{key: "min", typ: "integer", def: "1", doc: "the least cost", example: "1"},
			{key: "max", typ: "integer", def: "2^40", doc: "the most cost", example: "50"},
		}},
	}},
	{key: "classes", typ: "list of class names", def: "critical, default, sheddable, sandbox (other routed classes just below default)", doc: "the order of classes, most protected first, that every shedder, cohort cut and wait queue follows: a utilization gate's tiers and a queue's classes must agree with it, tiers left out follow it, and a ladder that protects a class protects every class above it. It must place every class the routes assign", example: "[critical, default, sheddable]"},
	{key: "gates", typ: "list of gates", def: "required, at least one", doc: "the chain, evaluated in order, cheapest first: every gate has the fields below, and its kind's own (see Gate kinds)"},
}

// keysOf returns the keys of the mapping at path in the schema ("" path:
// the top level).
func keysOf(path ...string) []string {
	ks := schema
	for _, p := range path {
		for i := range ks {
			if ks[i].key == p {
				ks = ks[i].sub
				break
			}
		}
	}
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.key
	}
	return names
}

// exampleFile is a policy file that writes every key of the schema, with
// its example value, and one gate: the reference shows it and a test
// parses it.
func exampleFile() string {
	var b strings.Builder
	for i := range schema {
		writeExample(&b, &schema[i], "")
	}
	b.WriteString("  - {name: per-client, kind: token_bucket, scope: tenant, rate: 100/s, burst: 500}\n")
	return b.String()
}

func writeExample(b *strings.Builder, k *key, indent string) {
	switch {
	case k.key == "gates":
		b.WriteString(indent + "gates:\n")
	case k.typ == "list of mappings":
		b.WriteString(indent + k.key + ":\n")
		for j := range k.sub {
			prefix := indent + "    "
			if j == 0 {
				prefix = indent + "  - "
			}
			writeExampleAt(b, &k.sub[j], prefix, indent+"    ")
		}
	case len(k.sub) > 0:
		b.WriteString(indent + k.key + ":\n")
		for j := range k.sub {
			writeExample(b, &k.sub[j], indent+"  ")
		}
	case k.commented:
		b.WriteString(indent + "# " + k.key + ": " + k.example + "\n")
	default:
		b.WriteString(indent + k.key + ": " + k.example + "\n")
	}
}

// writeExampleAt writes k with prefix on its first line (a list item's
// "- "), its sub-keys under indent.
func writeExampleAt(b *strings.Builder, k *key, prefix, indent string) {
	if len(k.sub) == 0 {
		b.WriteString(prefix + k.key + ": " + k.example + "\n")
		return
	}
	b.WriteString(prefix + k.key + ":\n")
	for j := range k.sub {
		writeExample(b, &k.sub[j], indent+"  ")
	}
}
