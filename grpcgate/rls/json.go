package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultMaxBody is the largest request body JSONHandler reads by default.
const DefaultMaxBody = 64 << 10

// JSONHandler serves envoyproxy/ratelimit's HTTP endpoint (its README,
// "/json endpoint"; src/server/server_impl.go, NewJsonHandler): a POST
// whose body is a RateLimitRequest in proto3 JSON (lowerCamelCase or the
// proto's field names: hitsAddend or hits_addend, isNegativeHits, limit
// {requestsPerUnit, unit "MINUTE" or 2}; 64-bit hits as numbers or
// strings), answered with the RateLimitResponse in proto3 JSON: 200 for
// OK, 429 for OVER_LIMIT, 400 for a malformed body or ErrInvalid, 413 for
// a body over MaxBody, 503 for ErrUnavailable, 405 for other methods.
// Mount it at /json. It is safe for concurrent use.
type JSONHandler struct {
	// Service answers the calls.
	Service Service
	// MaxBody bounds the request body in bytes. Default DefaultMaxBody.
	MaxBody int64
}

// ServeHTTP answers one call.
func (h *JSONHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "rls: POST a RateLimitRequest as JSON", http.StatusMethodNotAllowed)
		return
	}
	limit := h.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("rls: request body over %d bytes", limit), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "rls: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	req, err := DecodeRequest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := h.Service.ShouldRateLimit(r.Context(), req)
	switch {
	case errors.Is(err, ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out := EncodeResponse(resp)
	w.Header().Set("Content-Type", "application/json")
	switch resp.Overall {
	case CodeOK:
		w.WriteHeader(http.StatusOK)
	case CodeOverLimit:
		w.WriteHeader(http.StatusTooManyRequests)
	default:
		w.WriteHeader(http.StatusInternalServerError)
	}
	w.Write(out)
}

// The request in proto3 JSON: every field under its JSON name and its
// proto name.
type jsonRequest struct {
	Domain      *string          `json:"domain"`
	Descriptors []jsonDescriptor `json:"descriptors"`
	HitsAddend  *jsonUint        `json:"hitsAddend"`
	HitsAddendP *jsonUint        `json:"hits_addend"`
}

type jsonDescriptor struct {
	Entries         []jsonEntry   `json:"entries"`
	Limit           *jsonOverride `json:"limit"`
	HitsAddend      *jsonUint     `json:"hitsAddend"`
	HitsAddendP     *jsonUint     `json:"hits_addend"`
	IsNegativeHits  *bool         `json:"isNegativeHits"`
	IsNegativeHitsP *bool         `json:"is_negative_hits"`
}

type jsonEntry struct {
	Key   *string `json:"key"`
	Value *string `json:"value"`
}

type jsonOverride struct {
	RequestsPerUnit  *jsonUint `json:"requestsPerUnit"`
	RequestsPerUnitP *jsonUint `json:"requests_per_unit"`
	Unit             *jsonUnit `json:"unit"`
}

// jsonUint is a proto3 JSON unsigned integer: a number, or a decimal
// string (how 64-bit values are written).
type jsonUint struct{ v uint64 }

func (u *jsonUint) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		s = str
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		// Integral numbers may be written with an exponent or a fraction (1e3, 2.0).
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f < 0 || f != math.Trunc(f) || f >= 1<<64 {
			return fmt.Errorf("%s is not an unsigned integer", clipJSON(string(b)))
		}
		v = uint64(f)
	}
	u.v = v
	return nil
}

// jsonUnit is a RateLimitUnit: its name or its number.
type jsonUnit struct{ u Unit }

func (u *jsonUnit) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		for i, n := range unitNames {
			if n == name {
				u.u = Unit(i)
				return nil
			}
		}
		return fmt.Errorf("unit %s is not a RateLimitUnit name", clipJSON(string(b)))
	}
	var n jsonUint
	if err := n.UnmarshalJSON(b); err != nil || n.v > math.MaxUint8 {
		return fmt.Errorf("unit %s is not a RateLimitUnit", clipJSON(string(b)))
	}
	u.u = Unit(n.v)
	return nil
}

func clipJSON(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

// jsonNames are the field names of a RateLimitRequest in proto3 JSON, at
// any depth (the decoder places them).
var jsonNames = map[string]bool{
	"domain": true, "descriptors": true, "hitsAddend": true, "hits_addend": true,
	"entries": true, "key": true, "value": true, "limit": true, "isNegativeHits": true, "is_negative_hits": true,
	"requestsPerUnit": true, "requests_per_unit": true, "unit": true,
}

// checkNames walks data's tokens and refuses an object key that is not
// one of jsonNames as written, or that an object holds twice: encoding/json
// matches names without regard to case and keeps the last of two. A
// syntax error is left to the decoder.
func checkNames(data []byte) error {
	type frame struct {
		obj, wantKey bool
		keys         map[string]bool
	}
	var stack []*frame
	top := func() *frame {
		if len(stack) == 0 {
			return nil
		}
		return stack[len(stack)-1]
	}
	valueDone := func() {
		if f := top(); f != nil && f.obj {
			f.wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if f := top(); f != nil && f.obj && f.wantKey {
			if tok == json.Delim('}') {
				stack = stack[:len(stack)-1]
				valueDone()
				continue
			}
			name, _ := tok.(string)
			switch {
			case !jsonNames[name]:
				return fmt.Errorf("unknown field %s", clipJSON(strconv.Quote(name)))
			case f.keys[name]:
				return fmt.Errorf("field %q given twice", name)
			}
			f.keys[name], f.wantKey = true, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, wantKey: true, keys: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// either returns the one of a field's two spellings that is set; both set
// is an error, as in protojson.
func either[T any](a, b *T, name string) (*T, error) {
	if a != nil && b != nil {
		return nil, fmt.Errorf("field %s given twice (as its JSON and its proto name)", name)
	}
	if a != nil {
		return a, nil
	}
	return b, nil
}

// loneSurrogate returns the offset of the first \u escape in JSON text
// data that is a UTF-16 surrogate outside a high-low pair, or -1. Escaped
// backslashes ("\\\\u...") are not escapes of u.
func loneSurrogate(data []byte) int {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := unicodeEscape(data, i)
		if !ok {
			i++ // another escape: skip its character (a backslash escapes a backslash)
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := unicodeEscape(data, i+6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 11
				continue
			}
			return i
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		}
		i += 5
	}
	return -1
}

// unicodeEscape reads the \uXXXX escape at data[i:], if there is one.
func unicodeEscape(data []byte, i int) (rune, bool) {
	if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range data[i+2 : i+6] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// DecodeRequest parses a RateLimitRequest in proto3 JSON. Unknown fields
// (names match exactly, as protojson matches them), a field given twice
// (under one name or under both), text that is not UTF-8, trailing data and
// values out of range are errors wrapping ErrInvalid. Semantic checks (an
// empty domain, too many descriptors) are the Service's.
func DecodeRequest(data []byte) (*Request, error) {
	if !utf8.Valid(data) {
		// encoding/json would read each bad byte as U+FFFD, so that two
		// different values shared one counter; the gRPC endpoint refuses them.
		return nil, fmt.Errorf("%w: body is not UTF-8 (JSON text must be)", ErrInvalid)
	}
	if err := checkNames(data); err != nil {
		return nil, fmt.Errorf("%w: body is not a RateLimitRequest in JSON: %v", ErrInvalid, err)
	}
	if i := loneSurrogate(data); i >= 0 {
		// encoding/json would read it as U+FFFD: "\ud800" and "\udfff"
		// would share one counter.
		return nil, fmt.Errorf("%w: body has a lone UTF-16 surrogate escape at byte %d (a \\u escape of U+D800 to U+DFFF not in a high-low pair)", ErrInvalid, i)
	}
	var jr jsonRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jr); err != nil {
		return nil, fmt.Errorf("%w: body is not a RateLimitRequest in JSON: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrInvalid)
	}
	r := &Request{}
	if jr.Domain != nil {
		r.Domain = *jr.Domain
	}
	hits, err := either(jr.HitsAddend, jr.HitsAddendP, "hitsAddend")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if hits != nil {
		if hits.v > math.MaxUint32 {
			return nil, fmt.Errorf("%w: hitsAddend %d is out of range for a uint32", ErrInvalid, hits.v)
		}
		r.Hits = uint32(hits.v)
	}
	if len(jr.Descriptors) > 0 {
		r.Descriptors = make([]Descriptor, len(jr.Descriptors))
	}
	for i := range jr.Descriptors {
		if err := jr.Descriptors[i].decode(&r.Descriptors[i], i); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// decode fills d, the request's i-th descriptor, from jd.
func (jd *jsonDescriptor) decode(d *Descriptor, i int) error {
	if len(jd.Entries) > 0 {
		d.Entries = make([]Entry, len(jd.Entries))
	}
	for j, e := range jd.Entries {
		if e.Key != nil {
			d.Entries[j].Key = *e.Key
		}
		if e.Value != nil {
			d.Entries[j].Value = *e.Value
		}
	}
	h, err := either(jd.HitsAddend, jd.HitsAddendP, fmt.Sprintf("descriptors[%d].hitsAddend", i))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if h != nil {
		v := h.v
		d.Hits = &v
	}
	neg, err := either(jd.IsNegativeHits, jd.IsNegativeHitsP, fmt.Sprintf("descriptors[%d].isNegativeHits", i))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	d.Negative = neg != nil && *neg
	if jd.Limit == nil {
		return nil
	}
	rpu, err := either(jd.Limit.RequestsPerUnit, jd.Limit.RequestsPerUnitP, fmt.Sprintf("descriptors[%d].limit.requestsPerUnit", i))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	o := &Override{}
	if rpu != nil {
		if rpu.v > math.MaxUint32 {
			return fmt.Errorf("%w: descriptors[%d].limit.requestsPerUnit %d is out of range for a uint32", ErrInvalid, i, rpu.v)
		}
		o.RequestsPerUnit = uint32(rpu.v)
	}
	if jd.Limit.Unit != nil {
		o.Unit = jd.Limit.Unit.u
	}
	d.Limit = o
	return nil
}

// The response in proto3 JSON, fields in the proto's order, defaults left
// out as protojson leaves them out.
type jsonResponse struct {
	OverallCode          string       `json:"overallCode,omitempty"`
	Statuses             []jsonStatus `json:"statuses,omitempty"`
	ResponseHeadersToAdd []jsonHeader `json:"responseHeadersToAdd,omitempty"`
}

type jsonStatus struct {
	Code               string     `json:"code,omitempty"`
	CurrentLimit       *jsonLimit `json:"currentLimit,omitempty"`
	LimitRemaining     uint32     `json:"limitRemaining,omitempty"`
	DurationUntilReset string     `json:"durationUntilReset,omitempty"`
}

type jsonLimit struct {
	RequestsPerUnit uint32 `json:"requestsPerUnit,omitempty"`
	Unit            string `json:"unit,omitempty"`
	Name            string `json:"name,omitempty"`
}

type jsonHeader struct {
	Key   string `json:"key,omitempty"`
	Value string `json:"value,omitempty"`
}

var codeNames = [...]string{"UNKNOWN", "OK", "OVER_LIMIT"}

// String returns the code's protocol name, e.g. "OVER_LIMIT".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return strconv.Itoa(int(c))
}

// codeName is the code's JSON value: its name, "" (left out) for UNKNOWN.
func codeName(c Code) string {
	if c == CodeUnknown {
		return ""
	}
	return c.String()
}

// EncodeResponse renders a RateLimitResponse in proto3 JSON, e.g.
// {"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":10,"unit":"MINUTE"},"limitRemaining":9,"durationUntilReset":"58s"}]}.
func EncodeResponse(r *Response) []byte {
	jr := jsonResponse{OverallCode: codeName(r.Overall)}
	if len(r.Statuses) > 0 {
		jr.Statuses = make([]jsonStatus, len(r.Statuses))
	}
	for i, st := range r.Statuses {
		js := &jr.Statuses[i]
		js.Code = codeName(st.Code)
		js.LimitRemaining = st.Remaining
		if st.Limit != nil {
			js.CurrentLimit = &jsonLimit{RequestsPerUnit: st.Limit.RequestsPerUnit, Name: st.Limit.Name}
			if st.Limit.Unit != UnitUnknown {
				js.CurrentLimit.Unit = st.Limit.Unit.String()
			}
		}
		if st.ResetIn > 0 {
			js.DurationUntilReset = protoDuration(st.ResetIn)
		}
	}
	for _, h := range r.Headers {
		jr.ResponseHeadersToAdd = append(jr.ResponseHeadersToAdd, jsonHeader{Key: h.Name, Value: h.Value})
	}
	out, err := json.Marshal(jr)
	if err != nil { // cannot happen: strings and integers only
		return []byte(`{}`)
	}
	return out
}

// protoDuration writes d as google.protobuf.Duration's JSON: seconds with
// 0, 3, 6 or 9 fractional digits and an "s", e.g. "59s", "0.250s".
func protoDuration(d time.Duration) string {
	sec, ns := int64(d/time.Second), int64(d%time.Second)
	if ns == 0 {
		return strconv.FormatInt(sec, 10) + "s"
	}
	frac := fmt.Sprintf("%09d", ns)
	switch {
	case strings.HasSuffix(frac, "000000"):
		frac = frac[:3]
	case strings.HasSuffix(frac, "000"):
		frac = frac[:6]
	}
	return strconv.FormatInt(sec, 10) + "." + frac + "s"
}
