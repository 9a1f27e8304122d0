package identify

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"
)

// DefaultTokenHeader is where the bearer token of claim parts is read.
const DefaultTokenHeader = "Authorization"

// maxTokenBytes bounds the bearer token a claim is read from (8 KiB): a
// longer one is malformed, so that decoding an untrusted token costs a
// bounded time.
const maxTokenBytes = 8 << 10

// Token says where claim parts find the JSON Web Token (RFC 7519) whose
// claims they read.
//
// The token's signature is not verified: claims are read from a token
// that an authenticator in front of the service (an API gateway, Envoy's
// jwt_authn filter, oauth2-proxy) has already verified, or that the
// upstream verifies before doing any work. Put sluice behind that
// authenticator: in front of it, a client could write any claim and
// choose its own key, sharing another tenant's budget or escaping its own.
// Verifying here would need the issuer's keys and their rotation (JWKS),
// which the authenticator already has.
//
// A token longer than 8 KiB is malformed (the request is refused as
// invalid), so that decoding an untrusted token costs a bounded time.
type Token struct {
	// Header names the header holding the token. Default
	// DefaultTokenHeader, whose value must be "Bearer TOKEN" (RFC 6750
	// §2.1; the scheme in any case). In another header (one an
	// authenticator sets, such as X-Jwt-Assertion) the value is the token
	// itself, with or without the scheme.
	Header string
}

// Errors of claim extraction (in a request's 400 detail).
var (
	errToken      = errors.New("malformed bearer token")
	errClaimType  = errors.New("claim is not a string or a number")
	errClaimValue = errors.New("claim value is empty, too long or holds control characters")
)

// bearer returns the token in h's header name, or "" when there is none.
func bearer(h http.Header, name string) (string, error) {
	vs := h[name]
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", errToken
	}
	v := strings.TrimLeft(vs[0], " \t")
	scheme, rest, spaced := strings.Cut(v, " ")
	switch {
	case spaced && strings.EqualFold(scheme, "bearer"):
		v = strings.Trim(rest, " \t")
	case name == DefaultTokenHeader:
		return "", errToken // another scheme (Basic, ...) or none
	}
	if v == "" || len(v) > maxTokenBytes {
		return "", errToken
	}
	return v, nil
}

// claim returns the value of the top-level claim name in the payload of
// the compact JWS token (RFC 7515 §7.1: three base64url parts separated by
// dots; only the middle one is read). A string claim is its value; a
// number is its JSON text ("42"). It reports false when the claim is
// absent or null. Other types, bad encodings and values with control
// characters or over maxLen bytes are errors.
func claim(token, name string, maxLen int) (string, bool, error) {
	_, rest, ok1 := strings.Cut(token, ".")
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(sig, ".") || payload == "" {
		return "", false, errToken
	}
	raw := make([]byte, base64.RawURLEncoding.DecodedLen(len(payload)))
	n, err := base64.RawURLEncoding.Strict().Decode(raw, []byte(payload))
	if err != nil {
		return "", false, errToken
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(raw[:n], &claims); err != nil || claims == nil {
		return "", false, errToken
	}
	v, ok := claims[name]
	if !ok || bytes.Equal(v, []byte("null")) {
		return "", false, nil
	}
	var s string
	switch {
	case v[0] == '"':
		if err := json.Unmarshal(v, &s); err != nil {
			return "", false, errToken
		}
	case v[0] == '-' || v[0] >= '0' && v[0] <= '9':
		s = string(v)
	default:
		return "", false, errClaimType
	}
	if !validClaim(s, maxLen) {
		return "", false, errClaimValue
	}
	return s, true, nil
}

// validClaim reports whether s is 1 to max bytes of UTF-8 without control
// characters (which keys use as separators).
func validClaim(s string, max int) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}
