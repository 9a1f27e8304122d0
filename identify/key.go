package identify

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/sluice-go/sluice"
)

// Source is where one part of a key comes from.
type Source uint8

const (
	// SourceHeader is a request header's value (one field of visible
	// ASCII).
	SourceHeader Source = iota
	// SourceQuery is a query parameter's decoded value (one occurrence of
	// visible ASCII: a repeated parameter is refused, since the upstream
	// may read another occurrence than sluice does).
	SourceQuery
	// SourceClaim is a top-level claim of the bearer token (see Token).
	SourceClaim
	// SourceClientIP is the client's address, grouped by prefix (see
	// ClientIP).
	SourceClientIP
	// SourceRoute is the operation of the route the request matches
	// ("POST /v1/routes", or "other"): from the server's routes, never
	// from the raw path, so it has as many values as there are routes.
	SourceRoute
)

var sourceNames = [...]string{"header", "query", "claim", "ip", "route"}

// String returns the source's name in policy files: "header", "query",
// "claim", "ip" or "route".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Part is one part of a key.
type Part struct {
	Source Source
	// Name is the header, query parameter or claim (not used by
	// SourceClientIP and SourceRoute).
	Name string
}

// FromHeader is the key part of header name's value.
func FromHeader(name string) Part { return Part{Source: SourceHeader, Name: name} }

// FromQuery is the key part of query parameter name's value.
func FromQuery(name string) Part { return Part{Source: SourceQuery, Name: name} }

// FromClaim is the key part of the bearer token's claim name, e.g. "sub".
func FromClaim(name string) Part { return Part{Source: SourceClaim, Name: name} }

// FromClientIP is the key part of the client's address.
func FromClientIP() Part { return Part{Source: SourceClientIP} }

// FromRoute is the key part of the matched route's operation.
func FromRoute() Part { return Part{Source: SourceRoute} }

// KeyRules derive a key (a tenant) from parts of a request. A key of one
// part is that part's value; a key of several joins their values with a
// separator no value holds, so distinct requests never meet on one key. A
// key over sluice.MaxKeyLen bytes is replaced by its SHA-256, spelt so that
// no unhashed key can equal it. Keys are state keys: they are never logged
// or echoed.
type KeyRules struct {
	// Parts of the key, in order. Empty: every request has the key "".
	Parts []Part
	// ClientIP finds the client's address for a SourceClientIP part.
	ClientIP ClientIP
	// Token finds the bearer token of SourceClaim parts.
	Token Token
	// Required refuses requests where a part is missing (no header, query
	// parameter, token, claim or IP address) as invalid. Otherwise a
	// missing part counts as the empty value.
	Required bool
}

// normalize checks the rules and fills in their defaults.
func (k *KeyRules) normalize() error {
	k.Parts = append([]Part(nil), k.Parts...)
	for i := range k.Parts {
		p := &k.Parts[i]
		switch p.Source {
		case SourceHeader, SourceQuery, SourceClaim:
			if p.Name == "" {
				return fmt.Errorf("key part %d (%s): empty name", i, p.Source)
			}
		case SourceClientIP, SourceRoute:
			if p.Name != "" {
				return fmt.Errorf("key part %d (%s) takes no name", i, p.Source)
			}
		default:
			return fmt.Errorf("key part %d: unknown source %d", i, p.Source)
		}
		if p.Source == SourceHeader {
			p.Name = http.CanonicalHeaderKey(p.Name)
		}
	}
	if k.Token.Header == "" {
		k.Token.Header = DefaultTokenHeader
	}
	k.Token.Header = http.CanonicalHeaderKey(k.Token.Header)
	return k.ClientIP.normalize()
}

// Input is what identification reads of a request.
type Input struct {
	Method, Path string
	Header       http.Header
	// RawQuery is the request's query without '?' (URL.RawQuery), read by
	// SourceQuery parts.
	RawQuery string
	// RemoteAddr is the peer's "host:port" (http.Request.RemoteAddr), read
	// by SourceClientIP parts.
	RemoteAddr string
}

// keyer is compiled KeyRules.
type keyer struct {
	rules KeyRules
}

// Key separators: values never hold control characters, so these bytes
// keep composite keys apart from each other and from hashed ones.
const (
	partSep    = "\x1f"
	hashPrefix = "\x1e"
)

// key returns in's key. op is the matched route's operation. A request the
// rules refuse yields a non-empty detail for the caller's 400 message.
func (k *keyer) key(in *Input, op string) (key, detail string) {
	if len(k.rules.Parts) == 1 {
		v, missing, detail := k.part(&k.rules.Parts[0], in, op)
		if missing && k.rules.Required {
			return "", "missing " + k.describe(&k.rules.Parts[0])
		}
		return BoundKey(v), detail
	}
	var b strings.Builder
	for i := range k.rules.Parts {
		p := &k.rules.Parts[i]
		v, missing, detail := k.part(p, in, op)
		switch {
		case detail != "":
			return "", detail
		case missing && k.rules.Required:
			return "", "missing " + k.describe(p)
		}
		if i > 0 {
			b.WriteString(partSep)
		}
		b.WriteString(v)
	}
	return BoundKey(b.String()), ""
}

// BoundKey returns key if it is at most sluice.MaxKeyLen bytes, else its
// SHA-256 in 65 bytes that no key of visible characters spells (a 0x1e
// byte and 64 hex digits). Middleware applies it to the keys of custom
// KeyFuncs.
func BoundKey(key string) string {
	if len(key) <= sluice.MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// describe names a part in a 400 detail.
func (k *keyer) describe(p *Part) string {
	switch p.Source {
	case SourceHeader:
		return p.Name + " header"
	case SourceQuery:
		return "query parameter " + p.Name
	case SourceClaim:
		return "claim " + p.Name + " in the " + k.rules.Token.Header + " token"
	case SourceClientIP:
		return "client IP address"
	}
	return "route"
}

// part returns one part's value, whether it is missing, or a detail for a
// malformed one.
func (k *keyer) part(p *Part, in *Input, op string) (v string, missing bool, detail string) {
	switch p.Source {
	case SourceHeader:
		switch vs := in.Header[p.Name]; {
		case len(vs) > 1:
			return "", false, "more than one " + p.Name + " header"
		case len(vs) == 0:
			return "", true, ""
		case !validToken(vs[0], sluice.MaxKeyLen):
			return "", false, "malformed " + p.Name + " header"
		default:
			return vs[0], false, ""
		}
	case SourceQuery:
		return queryPart(in.RawQuery, p.Name)
	case SourceClaim:
		tok, err := bearer(in.Header, k.rules.Token.Header)
		if err != nil {
			return "", false, err.Error() + " in " + k.rules.Token.Header
		}
		if tok == "" {
			return "", true, ""
		}
		v, ok, err := claim(tok, p.Name, sluice.MaxKeyLen)
		if err != nil {
			return "", false, err.Error() + " (claim " + p.Name + " in " + k.rules.Token.Header + ")"
		}
		return v, !ok, ""
	case SourceClientIP:
		a, err := k.rules.ClientIP.client(in.RemoteAddr, in.Header)
		if err != nil {
			return "", true, ""
		}
		return k.rules.ClientIP.key(a), false, ""
	}
	return op, false, ""
}

// queryPart returns query parameter name's decoded value in raw.
func queryPart(raw, name string) (v string, missing bool, detail string) {
	found := false
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, val, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.Contains(k, "%") && !strings.Contains(k, "+") {
				continue
			}
			if dk, err := url.QueryUnescape(k); err != nil || dk != name {
				continue
			}
		}
		if found {
			return "", false, "more than one query parameter " + name
		}
		dv, err := url.QueryUnescape(val)
		if err != nil || !validToken(dv, sluice.MaxKeyLen) {
			return "", false, "malformed query parameter " + name
		}
		v, found = dv, true
	}
	return v, !found, ""
}

// KeyFunc returns a request's key, or an error when the request is
// malformed or lacks a required part (the middleware answers it 400 with
// the error's text, so it must not quote the request's values). It must
// be safe for concurrent use.
type KeyFunc func(r *http.Request) (string, error)

// ErrKey wraps the errors of the KeyFuncs of Key.
var ErrKey = errors.New("identify: key")

// Key compiles rules into a KeyFunc, for a key other than the policy's
// tenant (httpgate.Config.TenantKey) or for code of one's own. The
// returned function reads r.Header, r.URL.RawQuery and r.RemoteAddr; a
// SourceRoute part is r.Method and r.URL.Path ("GET /v1/x"), which the
// caller should bound (a route's operation is only known to an
// Identifier). A key of one header or query parameter does not allocate.
func Key(rules KeyRules) (KeyFunc, error) {
	if err := rules.normalize(); err != nil {
		return nil, fmt.Errorf("identify: %v", err)
	}
	k := &keyer{rules: rules}
	return func(r *http.Request) (string, error) {
		in := Input{Method: r.Method, Path: r.URL.Path, Header: r.Header, RawQuery: r.URL.RawQuery, RemoteAddr: r.RemoteAddr}
		op := ""
		for _, p := range k.rules.Parts {
			if p.Source == SourceRoute {
				op = r.Method + " " + r.URL.Path
				break
			}
		}
		key, detail := k.key(&in, op)
		if detail != "" {
			return "", fmt.Errorf("%w: %s", ErrKey, detail)
		}
		return key, nil
	}, nil
}
