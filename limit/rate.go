package limit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Rate is an exact rate: Tokens demand units per Per. It is kept as a
// reduced fraction of two integers, so 3/s, 1/h and 1e9/s are all exact and
// no algorithm accumulates rounding error. The zero Rate is invalid; build
// one with NewRate, ParseRate or RateFromFloat.
type Rate struct {
	tokens int64 // numerator: units
	per    int64 // denominator: nanoseconds
}

// ErrInvalidRate wraps every reason a rate is refused.
var ErrInvalidRate = errors.New("limit: invalid rate")

// NewRate returns the rate of tokens units per period. Both must be > 0.
func NewRate(tokens int64, per time.Duration) (Rate, error) {
	if tokens <= 0 {
		return Rate{}, fmt.Errorf("%w: %d tokens, want > 0", ErrInvalidRate, tokens)
	}
	if per <= 0 {
		return Rate{}, fmt.Errorf("%w: period %v, want > 0", ErrInvalidRate, per)
	}
	g := gcd(tokens, int64(per))
	return Rate{tokens: tokens / g, per: int64(per) / g}, nil
}

// PerSecond returns n units per second. It panics if n ≤ 0; use NewRate to
// handle untrusted input.
func PerSecond(n int64) Rate {
	r, err := NewRate(n, time.Second)
	if err != nil {
		panic(err)
	}
	return r
}

// rateFromFloat returns the rate of perSecond units per second, taking the
// float's shortest decimal form exactly (2.5 → 5 per 2 s). NaN, ±Inf,
// values ≤ 0 and decimals whose exact fraction does not fit in int64 are
// refused with an error wrapping ErrInvalidRate.
func rateFromFloat(perSecond float64) (Rate, error) {
	if math.IsNaN(perSecond) || math.IsInf(perSecond, 0) || perSecond <= 0 {
		return Rate{}, fmt.Errorf("%w: %v per second", ErrInvalidRate, perSecond)
	}
	r, err := parseDecimalRate(strconv.FormatFloat(perSecond, 'g', -1, 64), time.Second)
	if err != nil {
		return Rate{}, fmt.Errorf("%w: %v per second: %v", ErrInvalidRate, perSecond, err)
	}
	return r, nil
}

// ParseRate parses "N/UNIT" or "N/DURATION", with no spaces: N is a
// decimal number with an optional fraction and exponent ("100", "2.5",
// "1e9"); the period is one of the units ns, us (or µs), ms, s, m, h, d, or a
// Go duration that starts with a digit ("10s", "1m30s", "0.5s"). Examples:
// "100/s", "1/h", "2.5/s", "1000/10s". Every other spelling ("10/sec",
// "10/min", "10 / s") is refused with an error wrapping ErrInvalidRate
// that names the unit meant.
func ParseRate(s string) (Rate, error) {
	if strings.ContainsAny(s, " \t") {
		return Rate{}, fmt.Errorf("%w %q: no spaces (want N/UNIT, e.g. 100/s)", ErrInvalidRate, s)
	}
	num, unit, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w %q: want N/UNIT, e.g. 100/s", ErrInvalidRate, s)
	}
	per, err := parsePeriod(unit)
	if err != nil {
		return Rate{}, fmt.Errorf("%w %q: %v", ErrInvalidRate, s, err)
	}
	r, err := parseDecimalRate(num, per)
	if err != nil {
		return Rate{}, fmt.Errorf("%w %q: %v", ErrInvalidRate, s, err)
	}
	return r, nil
}

// periodUnits are the units a rate's period may be, and words that are
// refused with the unit they mean.
var (
	periodUnits = map[string]time.Duration{
		"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour,
	}
	periodWords = map[string]string{
		"sec": "s", "secs": "s", "second": "s", "seconds": "s", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
		"hr": "h", "hour": "h", "hours": "h", "day": "d", "days": "d", "S": "s", "M": "m", "H": "h", "D": "d",
	}
)

func parsePeriod(u string) (time.Duration, error) {
	if d, ok := periodUnits[u]; ok {
		return d, nil
	}
	if w, ok := periodWords[u]; ok {
		return 0, fmt.Errorf("period %q: write %q", u, w)
	}
	if u == "" {
		return 0, errors.New("missing period")
	}
	d, err := time.ParseDuration(u)
	if err != nil || u[0] < '0' || u[0] > '9' {
		return 0, fmt.Errorf("bad period %q (want ns, us, ms, s, m, h, d or a duration like 10s)", u)
	}
	if d <= 0 {
		return 0, fmt.Errorf("period %q must be positive", u)
	}
	return d, nil
}

// parseDecimalRate turns the decimal num (digits, optional '.', optional
// exponent) per period into an exact reduced fraction.
func parseDecimalRate(num string, per time.Duration) (Rate, error) {
	mant, exp := num, 0
	if i := strings.IndexAny(num, "eE"); i >= 0 {
		e, err := strconv.Atoi(num[i+1:])
		if err != nil || e > 30 || e < -30 {
			return Rate{}, fmt.Errorf("bad exponent in %q", num)
		}
		mant, exp = num[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return Rate{}, fmt.Errorf("%q is not a positive decimal number", num)
	}
	digits = strings.TrimLeft(digits, "0")
	exp -= len(frac)
	// Drop trailing zeros into the exponent to keep the mantissa small.
	for len(digits) > 1 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		exp++
	}
	if digits == "" {
		return Rate{}, errors.New("rate must be > 0")
	}
	m, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return Rate{}, fmt.Errorf("%q has too many digits", num)
	}
	tokens, p := m, int64(per)
	for ; exp > 0; exp-- {
		if tokens > math.MaxInt64/10 {
			return Rate{}, fmt.Errorf("%q is too large", num)
		}
		tokens *= 10
	}
	for ; exp < 0; exp++ {
		if g := gcd(tokens, 10); g > 1 {
			tokens /= g
			p *= 10 / g
			continue
		}
		if p > math.MaxInt64/10 {
			return Rate{}, fmt.Errorf("%q has more precision than the period can hold", num)
		}
		p *= 10
	}
	if tokens <= 0 || p <= 0 {
		return Rate{}, errors.New("rate must be > 0")
	}
	g := gcd(tokens, p)
	return Rate{tokens: tokens / g, per: p / g}, nil
}

// Tokens returns the numerator of the reduced rate.
func (r Rate) Tokens() int64 { return r.tokens }

// Per returns the denominator of the reduced rate.
func (r Rate) Per() time.Duration { return time.Duration(r.per) }

// isZero reports whether r is the invalid zero Rate.
func (r Rate) isZero() bool { return r.per == 0 }

// String formats r as "N/PERIOD", e.g. "100/s", "1/1h0m0s".
func (r Rate) String() string {
	if r.per == 0 {
		return "0"
	}
	per := time.Duration(r.per)
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}, {time.Nanosecond, "ns"}} {
		if per%u.d == 0 {
			if per == u.d {
				return fmt.Sprintf("%d/%s", r.tokens, u.name)
			}
			// Scale the period to one unit when the numerator stays whole.
			k := int64(per / u.d)
			return fmt.Sprintf("%d/%d%s", r.tokens, k, u.name)
		}
	}
	return fmt.Sprintf("%d/%dns", r.tokens, r.per)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
