package client

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Limit is one member of a RateLimit field (draft-ietf-httpapi-ratelimit-
// headers-10): the quota policy it reports on, the quota units remaining
// (r) and the seconds until they are restored (t; 0 when absent).
type Limit struct {
	Policy    string
	Remaining int64
	Reset     time.Duration
}

// Quota is one member of a RateLimit-Policy field: the policy's name, its
// quota (q) and its window (w; 0 when absent, e.g. a concurrency quota).
type Quota struct {
	Policy string
	Quota  int64
	Window time.Duration
}

// MaxWait bounds any wait a server asks for (a day), in a field or in a
// gRPC status: a larger one is read as a day, so that no arithmetic on it
// overflows.
const MaxWait = 24 * time.Hour

// ParseRateLimit parses a RateLimit field value: a Structured Field List
// (RFC 9651) of items naming a policy (a String or a Token) with the
// parameters r (required) and t. Unknown parameters are ignored, as the
// draft asks. It returns an error naming the fault for anything else.
func ParseRateLimit(v string) ([]Limit, error) {
	items, err := parseList(v)
	if err != nil {
		return nil, err
	}
	out := make([]Limit, 0, len(items))
	for _, it := range items {
		r, ok := it.params["r"]
		if !ok {
			return nil, fmt.Errorf("RateLimit %q: member %q has no r parameter", v, it.name)
		}
		l := Limit{Policy: it.name, Remaining: r}
		if t, ok := it.params["t"]; ok {
			l.Reset = seconds(t)
		}
		out = append(out, l)
	}
	return out, nil
}

// ParsePolicy parses a RateLimit-Policy field value: a List of items
// naming a policy with the parameters q (required) and w.
func ParsePolicy(v string) ([]Quota, error) {
	items, err := parseList(v)
	if err != nil {
		return nil, err
	}
	out := make([]Quota, 0, len(items))
	for _, it := range items {
		q, ok := it.params["q"]
		if !ok {
			return nil, fmt.Errorf("RateLimit-Policy %q: member %q has no q parameter", v, it.name)
		}
		p := Quota{Policy: it.name, Quota: q}
		if w, ok := it.params["w"]; ok {
			p.Window = seconds(w)
		}
		out = append(out, p)
	}
	return out, nil
}

// seconds converts a field's whole seconds to a wait bounded by MaxWait.
func seconds(n int64) time.Duration {
	if n > int64(MaxWait/time.Second) {
		return MaxWait
	}
	return time.Duration(n) * time.Second
}

// sfItem is a parsed list member: its name and its integer parameters
// (parameters of other types are skipped).
type sfItem struct {
	name   string
	params map[string]int64
}

var errEmpty = errors.New("empty field")

// parseList parses the subset of an RFC 9651 List that the RateLimit
// fields use: members separated by commas, each a String or Token with
// parameters whose values are Integers, Strings, Tokens or Booleans.
func parseList(v string) ([]sfItem, error) {
	p := sfParser{s: v}
	p.ows()
	if p.done() {
		return nil, errEmpty
	}
	var out []sfItem
	for {
		it, err := p.item()
		if err != nil {
			return nil, fmt.Errorf("%q: %w", v, err)
		}
		out = append(out, it)
		p.ows()
		if p.done() {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("%q: want ',' at offset %d", v, p.i)
		}
		p.i++
		p.ows()
		if p.done() {
			return nil, fmt.Errorf("%q: trailing comma", v)
		}
		if len(out) >= 64 {
			return nil, fmt.Errorf("%q: more than 64 members", v)
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	var it sfItem
	var err error
	switch c := p.s[p.i]; {
	case c == '"':
		it.name, err = p.str()
	case isAlpha(c) || c == '*':
		it.name = p.token()
	default:
		return it, fmt.Errorf("want a policy name (string or token) at offset %d", p.i)
	}
	if err != nil {
		return it, err
	}
	it.params = map[string]int64{}
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		for !p.done() && p.s[p.i] == ' ' {
			p.i++
		}
		key := p.key()
		if key == "" {
			return it, fmt.Errorf("want a parameter name at offset %d", p.i)
		}
		if p.done() || p.s[p.i] != '=' {
			continue // a Boolean true parameter
		}
		p.i++
		if err := p.param(&it, key); err != nil {
			return it, err
		}
	}
	return it, nil
}

// param parses a parameter's value, keeping Integers.
func (p *sfParser) param(it *sfItem, key string) error {
	if p.done() {
		return fmt.Errorf("parameter %s: missing value", key)
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		n, err := p.integer()
		if err != nil {
			return fmt.Errorf("parameter %s: %w", key, err)
		}
		if n < 0 {
			return fmt.Errorf("parameter %s: %d is negative", key, n)
		}
		it.params[key] = n
	case c == '"':
		_, err := p.str()
		return err
	case c == '?':
		if p.i+1 >= len(p.s) || (p.s[p.i+1] != '0' && p.s[p.i+1] != '1') {
			return fmt.Errorf("parameter %s: bad boolean", key)
		}
		p.i += 2
	case isAlpha(c) || c == '*':
		p.token()
	default:
		return fmt.Errorf("parameter %s: bad value at offset %d", key, p.i)
	}
	return nil
}

func (p *sfParser) str() (string, error) {
	var b strings.Builder
	for p.i++; p.i < len(p.s); p.i++ {
		c := p.s[p.i]
		switch {
		case c == '\\':
			p.i++
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", errors.New("bad escape in string")
			}
			b.WriteByte(p.s[p.i])
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("non-printable character in string")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("unterminated string")
}

func (p *sfParser) token() string {
	start := p.i
	p.i++
	for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *sfParser) key() string {
	start := p.i
	if p.done() || !(p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] == '*') {
		return ""
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z' || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i]
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	if p.i == digits || p.i-digits > 15 {
		return 0, fmt.Errorf("want an integer of 1 to 15 digits at offset %d", start)
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		return 0, fmt.Errorf("want an integer, not a decimal, at offset %d", start)
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isTokenChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

// parseRetryAfter parses a Retry-After field value (RFC 9110 §10.2.3):
// delay-seconds, or an HTTP-date read against date (the response's Date,
// else the local clock's time). It returns the wait (0 for a date in the
// past), bounded by a day, or an error for anything else (a negative or
// fractional number, a malformed date).
func parseRetryAfter(v string, date time.Time) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, errEmpty
	}
	if isDigit(v[0]) {
		for i := 0; i < len(v); i++ {
			if !isDigit(v[i]) {
				return 0, fmt.Errorf("Retry-After %q: want delay-seconds or an HTTP-date", v)
			}
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > uint64(MaxWait/time.Second) {
			return MaxWait, nil // a huge number: as long as we wait at most
		}
		return time.Duration(n) * time.Second, nil
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, fmt.Errorf("Retry-After %q: want delay-seconds or an HTTP-date", v)
	}
	d := t.Sub(date)
	switch {
	case d <= 0:
		return 0, nil
	case d > MaxWait || d == math.MinInt64:
		return MaxWait, nil
	}
	return d, nil
}
