package policy

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// Load reads, parses and validates the policy file at path (see Parse).
func Load(path string) (*File, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses a policy file and validates it (Validate): on success the
// file builds, except for a store that cannot be reached. On failure the
// error is Errors, each naming the file, the line and the field.
func Parse(path string, data []byte) (*File, error) {
	doc, err := yamlfile.Document(path, data, "policy")
	if err != nil {
		return nil, err
	}
	if yamlfile.HasKey(doc, "domain") && !yamlfile.HasKey(doc, "gates") && !yamlfile.HasKey(doc, "version") {
		return nil, Errors{{File: path, Line: doc.Line, Field: "(file)",
			Msg: "an envoyproxy/ratelimit configuration (it names a domain), not a sluice policy: serve it with sluice serve --config, check it with sluice check"}}
	}
	p := &parser{Walker: yamlfile.Walker{File: path}}
	f := p.file(doc)
	if err := p.Err(); err != nil {
		return nil, err
	}
	if err := Validate(f); err != nil {
		return nil, err
	}
	return f, nil
}

type parser struct {
	yamlfile.Walker
}

// fail records err, an error of another package, at n's line in path.
func (p *parser) fail(n *yaml.Node, path string, err error) {
	msg := err.Error()
	for _, pkg := range []string{"sluice: ", "limit: ", "identify: ", "gate: ", "shed: "} {
		msg = strings.TrimPrefix(msg, pkg) // the field names the subject already
	}
	p.Errs = append(p.Errs, &Error{File: p.File, Line: n.Line, Field: path, Msg: msg, Err: err})
}

func (p *parser) file(n *yaml.Node) *File {
	f := &File{Path: p.File, Store: Store{Backend: BackendMemory, Line: n.Line}}
	var gates *yaml.Node
	seen := p.Fields(n, "", keysOf(), func(key string, v *yaml.Node) {
		switch key {
		case "version":
			f.Version = int(p.Integer(v, key, 1, 1))
		case "service":
			if f.Service = p.Str(v, key); f.Service != "" && !validName(f.Service) {
				p.Errf(v, key, "%q: want lowercase letters, digits, '.', '_' or '-' (it names metrics and Redis keys)", f.Service)
			}
		case "spec":
			f.spec = p.spec(v)
		case "store":
			f.Store = p.store(v)
		case "identity":
			f.identity = p.identity(v)
		case "routes":
			f.routes = p.routes(v)
		case "classes":
			f.ClassOrder, f.ClassOrderLine = p.classList(v, key), v.Line
		case "gates":
			gates = v // after the store, wherever it is written: gates inherit its failure policy
		}
	})
	if n.Kind == yaml.MappingNode {
		for _, req := range []string{"version", "gates"} {
			if _, ok := seen[req]; !ok {
				p.Errf(n, req, "missing (required)")
			}
		}
	}
	if gates != nil {
		if gates.Kind == yaml.SequenceNode && len(gates.Content) == 0 {
			p.Errf(gates, "gates", "empty: a policy without gates admits every request (write at least one gate)")
		}
		f.Gates = p.gates(gates, f.Store)
	}
	if h := f.identity.TenantHeader; h != "" && strings.EqualFold(h, f.identity.DeadlineHeader) {
		p.Errf(n, "identity.deadline.header", "%q is also the tenant header", h)
	}
	return f
}

func (p *parser) spec(n *yaml.Node) specText {
	var s specText
	p.Fields(n, "spec", keysOf("spec"), func(k string, v *yaml.Node) {
		text := p.Str(v, yamlfile.Join("spec", k))
		switch k {
		case "operation":
			s.Operation = text
		case "resource":
			s.Resource = text
		case "owner":
			s.Owner = text
		}
	})
	return s
}

var redisOnly = []string{"addrs", "cluster", "timeout", "replicas", "probe_every", "username", "password_env", "password_file", "tls"}

func (p *parser) store(n *yaml.Node) Store {
	s := Store{Backend: BackendMemory, Line: n.Line}
	seen := p.Fields(n, "store", keysOf("store"), func(k string, v *yaml.Node) {
		p.storeField(&s, k, v)
	})
	if s.Backend == BackendRedis && len(s.Addrs) == 0 {
		p.Errf(n, "store.addrs", "missing: the redis backend needs addrs (host:port of a server or of cluster nodes)")
	}
	if l, ok := seen["password_file"]; ok && s.PasswordEnv != "" {
		p.Errs = append(p.Errs, &Error{File: p.File, Line: l, Field: "store.password_file", Msg: "password_env names the password already: write one of them"})
	}
	if l, ok := seen["username"]; ok && s.PasswordEnv == "" && s.PasswordFile == "" {
		p.Errs = append(p.Errs, &Error{File: p.File, Line: l, Field: "store.username", Msg: "a user needs its password: write password_env or password_file"})
	}
	if s.Backend != BackendRedis {
		for _, k := range redisOnly {
			if line, ok := seen[k]; ok {
				p.Errs = append(p.Errs, &Error{File: p.File, Line: line, Field: "store." + k, Msg: "applies to the redis backend only"})
			}
		}
	}
	return s
}

func (p *parser) storeField(s *Store, k string, v *yaml.Node) {
	path := yamlfile.Join("store", k)
	switch k {
	case "backend":
		s.Backend = p.OneOf(v, path, BackendMemory, BackendRedis)
	case "addrs":
		if v.Kind != yaml.SequenceNode {
			p.Errf(v, path, "want a list of host:port")
			return
		}
		for i, a := range v.Content {
			s.Addrs = append(s.Addrs, p.Str(a, fmt.Sprintf("%s[%d]", path, i)))
		}
	case "cluster":
		p.Boolean(v, path) // the topology is discovered; the key stays for clarity
	case "timeout":
		s.Timeout = p.Duration(v, path, time.Microsecond)
	case "on_failure":
		s.OnFailure, s.onFailureSet = p.failurePolicy(v, path), true
	case "max_keys":
		s.MaxKeys = int(p.Integer(v, path, 1, 1<<30))
	case "replicas":
		s.Replicas = p.Integer(v, path, 1, 100_000)
	case "probe_every":
		s.ProbeEvery = p.Duration(v, path, 10*time.Millisecond)
	case "username":
		s.usernameLine = v.Line
		s.Username = p.nonEmpty(v, path, p.Str(v, path), "an ACL user name")
	case "password_env":
		s.passwordField, s.passwordLine = path, v.Line
		s.PasswordEnv = p.nonEmpty(v, path, p.Str(v, path), "the name of an environment variable")
		if s.PasswordEnv != "" {
			s.password = os.Getenv(s.PasswordEnv)
			if s.password == "" {
				p.Errf(v, path, "the environment variable %s is not set, or empty", s.PasswordEnv)
			}
		}
	case "password_file":
		s.passwordField, s.passwordLine = path, v.Line
		s.PasswordFile = p.nonEmpty(v, path, p.Str(v, path), "a file holding the password")
		if s.PasswordFile != "" {
			if b, ok := p.readFile(v, path, s.PasswordFile); ok {
				s.password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
				if s.password == "" {
					p.Errf(v, path, "%s is empty", s.PasswordFile)
				}
			}
		}
	case "tls":
		s.tls = p.storeTLS(v, path)
	}
}

// readFile reads name, relative to the policy file's directory unless it
// is absolute, or reports why it cannot at v.
func (p *parser) readFile(v *yaml.Node, path, name string) ([]byte, bool) {
	if !filepath.IsAbs(name) {
		name = filepath.Join(filepath.Dir(p.File), name)
	}
	b, err := yamlfile.ReadFile(name)
	if err != nil {
		p.Errf(v, path, "%v", err)
		return nil, false
	}
	return b, true
}

// storeTLS parses store.tls and builds its configuration from the files it
// names: TLS 1.2 at least, the server's certificate verified.
func (p *parser) storeTLS(n *yaml.Node, path string) *storeTLS {
	t := &storeTLS{Line: n.Line}
	nodes := map[string]*yaml.Node{}
	p.Fields(n, path, keysOf("store", "tls"), func(k string, v *yaml.Node) {
		nodes[k] = v
		s := p.nonEmpty(v, yamlfile.Join(path, k), p.Str(v, yamlfile.Join(path, k)), "a value")
		switch k {
		case "ca_file":
			t.CAFile = s
		case "cert_file":
			t.CertFile = s
		case "key_file":
			t.KeyFile = s
		case "server_name":
			t.ServerName = s
		}
	})
	cfg := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	sum := sha256.New()
	fmt.Fprintf(sum, "%q %q %q %q\n", t.CAFile, t.CertFile, t.KeyFile, t.ServerName)
	if t.CAFile != "" {
		if b, ok := p.readFile(nodes["ca_file"], yamlfile.Join(path, "ca_file"), t.CAFile); ok {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(b) {
				p.Errf(nodes["ca_file"], yamlfile.Join(path, "ca_file"), "%s holds no PEM certificate", t.CAFile)
			}
			sum.Write(b)
		}
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		at, field := nodes["cert_file"], "key_file"
		if at == nil {
			at, field = nodes["key_file"], "cert_file"
		}
		p.Errf(at, yamlfile.Join(path, field), "missing: a client certificate needs both cert_file and key_file")
	case t.CertFile != "":
		cert, certOK := p.readFile(nodes["cert_file"], yamlfile.Join(path, "cert_file"), t.CertFile)
		key, keyOK := p.readFile(nodes["key_file"], yamlfile.Join(path, "key_file"), t.KeyFile)
		if certOK && keyOK {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				p.Errf(nodes["cert_file"], yamlfile.Join(path, "cert_file"), "with key_file: %v", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
			sum.Write(cert)
			sum.Write(key)
		}
	}
	t.config, t.digest = cfg, hex.EncodeToString(sum.Sum(nil))
	return t
}

func (p *parser) failurePolicy(v *yaml.Node, path string) gate.FailurePolicy {
	fp, err := gate.ParseFailurePolicy(p.Str(v, path))
	if err != nil && v.Kind == yaml.ScalarNode {
		p.fail(v, path, err)
	}
	return fp
}

func (p *parser) identity(n *yaml.Node) identity {
	id := identity{Line: n.Line}
	lines := map[string]int{}
	p.Fields(n, "identity", keysOf("identity"), func(k string, v *yaml.Node) {
		path := yamlfile.Join("identity", k)
		lines[k] = v.Line
		if k == "path_match" {
			m, err := identify.ParsePathMatch(p.Str(v, path))
			if err != nil && v.Kind == yaml.ScalarNode {
				p.fail(v, path, err)
			}
			id.PathMatch = m
			return
		}
		seen := p.Fields(v, path, keysOf("identity", k), func(kk string, vv *yaml.Node) {
			p.identityField(&id, k, kk, vv, yamlfile.Join(path, kk))
		})
		if k == "peers" && v.Kind == yaml.MappingNode && len(seen) == 0 {
			p.Errf(v, path, "no trusted: write the peers' addresses, e.g. trusted: [10.0.0.0/8]")
		}
		if k == "deadline" && v.Kind == yaml.MappingNode {
			p.deadlineSection(&id, path, seen)
		}
		if k == "tenant" && v.Kind == yaml.MappingNode && len(id.tenantParts()) == 0 {
			if _, ok := seen["required"]; ok || len(seen) == 0 {
				p.Errf(v, path, "no source: write one or more of header, query, claim, ip: true, route: true")
			}
		}
	})
	p.identityUnused(&id, lines)
	return id
}

// deadlineSection refuses a deadline section that cannot mean what it
// says: a default above the max (cut to the max) and a max with neither a
// header nor a default (nothing it bounds).
func (p *parser) deadlineSection(id *identity, path string, seen map[string]int) {
	maxD := id.MaxDeadline
	if maxD == 0 {
		maxD = identify.DefaultMaxDeadline
	}
	fail := func(k, format string, args ...any) {
		p.Errs = append(p.Errs, &Error{File: p.File, Line: seen[k], Field: yamlfile.Join(path, k), Msg: fmt.Sprintf(format, args...)})
	}
	if _, ok := seen["default"]; ok && id.DefaultDeadline > maxD {
		fail("default", "%v, above the max of %v: a request without the header would get %v", id.DefaultDeadline, maxD, maxD)
	}
	if _, ok := seen["max"]; ok && id.DeadlineHeader == "" && id.DefaultDeadline == 0 {
		fail("max", "bounds nothing without a header or a default: write header (the callers' deadline) or default")
	}
}

// identityUnused refuses the sections that no tenant part reads.
func (p *parser) identityUnused(id *identity, lines map[string]int) {
	id.ClientIPLine = lines["client_ip"] // checked with the gates: scope client reads it too
	if l, ok := lines["token"]; ok && id.TenantClaim == "" {
		p.Errs = append(p.Errs, &Error{File: p.File, Line: l, Field: "identity.token", Msg: "applies only to a tenant keyed by a claim (identity.tenant.claim)"})
	}
}

func (p *parser) identityField(id *identity, section, k string, v *yaml.Node, path string) {
	switch section {
	case "tenant":
		p.tenantField(id, k, v, path)
	case "client_ip":
		p.clientIPField(&id.ClientIP, k, v, path)
	case "peers":
		id.TrustedPeers = p.prefixes(v, path)
	case "token":
		id.TokenHeader = p.header(v, path)
	case "deadline":
		switch k {
		case "header":
			id.DeadlineHeader = p.header(v, path)
		case "max":
			id.MaxDeadline = p.Duration(v, path, time.Millisecond)
		case "default":
			id.DefaultDeadline = p.Duration(v, path, time.Millisecond)
		}
	case "request_id":
		id.RequestIDHeader = p.header(v, path)
	}
}

func (p *parser) tenantField(id *identity, k string, v *yaml.Node, path string) {
	switch k {
	case "header":
		id.TenantHeader = p.nonEmpty(v, path, p.header(v, path), "a header name, e.g. X-Api-Key")
	case "query":
		q := p.nonEmpty(v, path, p.Str(v, path), "a query parameter, e.g. api_key")
		if strings.ContainsAny(q, "&=#?+% \t") {
			p.Errf(v, path, "%q is not a plain query parameter name", q)
		}
		id.TenantQuery = q
	case "claim":
		id.TenantClaim = p.nonEmpty(v, path, p.Str(v, path), "a top-level claim of the bearer token, e.g. sub")
	case "ip":
		id.TenantIP = p.Boolean(v, path)
	case "route":
		id.TenantRoute = p.Boolean(v, path)
	case "required":
		id.TenantRequired = p.Boolean(v, path)
	}
}

// nonEmpty reports an empty scalar as missing what want says.
func (p *parser) nonEmpty(v *yaml.Node, path, s, want string) string {
	if s == "" && v.Kind == yaml.ScalarNode {
		p.Errf(v, path, "empty: want %s", want)
	}
	return s
}

func (p *parser) clientIPField(c *identify.ClientIP, k string, v *yaml.Node, path string) {
	switch k {
	case "trusted_proxies":
		c.TrustedProxies = p.prefixes(v, path)
	case "header":
		h, err := identify.ParseForwardedHeader(p.Str(v, path))
		if err != nil && v.Kind == yaml.ScalarNode {
			p.fail(v, path, err)
		}
		c.Header = h
	case "ipv4_prefix":
		c.IPv4Prefix = int(p.Integer(v, path, 1, 32))
	case "ipv6_prefix":
		c.IPv6Prefix = int(p.Integer(v, path, 1, 128))
	}
}

// prefixes parses a list of CIDRs or addresses.
func (p *parser) prefixes(v *yaml.Node, path string) []netip.Prefix {
	if v.Kind != yaml.SequenceNode {
		p.Errf(v, path, "want a list of CIDRs or addresses, e.g. [10.0.0.0/8, 2001:db8::/32]")
		return nil
	}
	var ps []netip.Prefix
	for i, e := range v.Content {
		at := fmt.Sprintf("%s[%d]", path, i)
		if s := p.Str(e, at); e.Kind == yaml.ScalarNode {
			pfx, err := identify.ParseTrustedProxy(s)
			if err != nil {
				p.fail(e, at, err)
				continue
			}
			ps = append(ps, pfx)
		}
	}
	return ps
}

var headerName = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_` + "`" + `|~-]+$`)

// header parses a header name.
func (p *parser) header(v *yaml.Node, path string) string {
	h := p.Str(v, path)
	if h != "" && !headerName.MatchString(h) {
		p.Errf(v, path, "%q is not a valid header name", h)
	}
	return h
}

var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

func (p *parser) routes(n *yaml.Node) []route {
	if n.Kind != yaml.SequenceNode {
		p.Errf(n, "routes", "want a list of routes, got %s", yamlfile.KindName(n))
		return nil
	}
	var rs []route
	for i, rn := range n.Content {
		r := p.route(rn, fmt.Sprintf("routes[%d]", i))
		for _, earlier := range rs {
			if (earlier.Method == "" || earlier.Method == r.Method) && covers(earlier.Path, r.Path) {
				p.Errf(rn, fmt.Sprintf("routes[%d].match", i), "never matches: the route at line %d (%s) comes first and takes every request it would",
					earlier.Line, strings.TrimSpace(earlier.Method+" "+earlier.Path))
				break
			}
		}
		rs = append(rs, r)
	}
	return rs
}

// covers reports whether every path route pattern b matches, pattern a
// matches too (identify's matching: "*" is one segment, a final "*" one
// or more); false when unsure (a path folded by lenient matching may
// match a more often).
func covers(a, b string) bool {
	as := strings.Split(strings.TrimPrefix(a, "/"), "/")
	bs := strings.Split(strings.TrimPrefix(b, "/"), "/")
	for i, pa := range as {
		if i >= len(bs) {
			return false
		}
		pb, lastA, lastB := bs[i], i == len(as)-1, i == len(bs)-1
		switch {
		case pa == "*" && lastA:
			return pb != ""
		case pa == "*" && (pb == "" || pb == "*" && lastB):
			return false // b matches an empty segment, or more segments than a takes
		case pa != "*" && pa != pb:
			return false
		}
	}
	return len(bs) == len(as)
}

func (p *parser) route(n *yaml.Node, path string) route {
	r := route{Line: n.Line, Cost: routeCost{Fixed: 1}}
	seen := p.Fields(n, path, keysOf("routes"), func(k string, v *yaml.Node) {
		field := yamlfile.Join(path, k)
		switch k {
		case "match":
			p.match(&r, v, field)
		case "class":
			r.Class = p.Str(v, field)
			if r.Class != "" && !validName(r.Class) {
				p.Errf(v, field, "%q: class names use a-z, 0-9, '_' and '-'", r.Class)
			}
		case "cost":
			r.Cost = p.cost(v, field)
		}
	})
	if _, ok := seen["match"]; !ok && n.Kind == yaml.MappingNode {
		p.Errf(n, yamlfile.Join(path, "match"), "missing (required)")
	}
	return r
}

func (p *parser) match(r *route, n *yaml.Node, path string) {
	p.Fields(n, path, keysOf("routes", "match"), func(k string, v *yaml.Node) {
		field := yamlfile.Join(path, k)
		switch k {
		case "method":
			m := p.Str(v, field)
			if m != "" && !slices.Contains(methods, strings.ToUpper(m)) {
				p.Errf(v, field, "%q is not one of %s", m, strings.Join(methods, ", "))
				return
			}
			r.Method = strings.ToUpper(m)
		case "path":
			r.Path = p.Str(v, field)
			if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
				p.Errf(v, field, "%q must start with /", r.Path)
			} else if strings.ContainsAny(r.Path, "?# \t") {
				p.Errf(v, field, "%q: a path pattern has no query, fragment or spaces", r.Path)
			}
		}
	})
	if r.Path == "" && n.Kind == yaml.MappingNode {
		p.Errf(n, yamlfile.Join(path, "path"), "missing (required)")
	}
}

func (p *parser) cost(n *yaml.Node, path string) routeCost {
	c := routeCost{Fixed: 1}
	if n.Kind == yaml.ScalarNode {
		c.Fixed = p.Integer(n, path, 1, sluice.MaxCost)
		return c
	}
	p.Fields(n, path, keysOf("routes", "cost"), func(k string, v *yaml.Node) {
		field := yamlfile.Join(path, k)
		switch k {
		case "header":
			c.Header = p.header(v, field)
		case "response_header":
			c.ResponseHeader = p.header(v, field)
		case "per":
			c.Per = p.Integer(v, field, 1, sluice.MaxCost)
		case "min":
			c.Min = p.Integer(v, field, 1, sluice.MaxCost)
		case "max":
			c.Max = p.Integer(v, field, 1, sluice.MaxCost)
		}
	})
	if c.Header == "" && c.ResponseHeader == "" && n.Kind == yaml.MappingNode {
		p.Errf(n, yamlfile.Join(path, "header"), "missing: a cost mapping reads a header, the request's or the answer's (response_header), or write a fixed cost: cost: 5")
	}
	if c.Min > 0 && c.Max > 0 && c.Min > c.Max {
		p.Errf(n, path, "min %d is above max %d", c.Min, c.Max)
	}
	return c
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

func validName(s string) bool { return nameRE.MatchString(s) }
