package whatif

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Decision is what the recording says became of a request.
type Decision uint8

const (
	// Unknown: the log does not say (nginx, Envoy).
	Unknown Decision = iota
	// Admitted by sluice.
	Admitted
	// Rejected by sluice (Gate and Reason say which and why).
	Rejected
)

// Record is one recorded request.
type Record struct {
	// At is when the request arrived, in Unix nanoseconds.
	At int64
	// Method and Path are the request's (the path without its query).
	Method, Path string
	// Tenant is the caller as the log names it ("" when it does not): the
	// tenant label of sluice's log, an Envoy field, nginx's remote user.
	Tenant string
	// Remote is the client's address ("" unknown).
	Remote string
	// Status is the answer's status code.
	Status int
	// Duration is how long the request was handled; negative: unknown.
	Duration time.Duration
	// Cost is the recorded cost (0: the routes' own).
	Cost int64
	// Wait is how long its decision waited, in a gate's wait queue or
	// paced (sluice's log; 0: it did not, or the log does not say): the
	// request arrived Wait before it was decided, and At is its arrival.
	Wait time.Duration
	// Decision, Gate and Reason are the recorded decision.
	Decision     Decision
	Gate, Reason string
}

// Format is a log format.
type Format string

// The formats.
const (
	FormatAuto     Format = ""
	FormatSluice   Format = "sluice"   // sluice's access log, JSON lines or text
	FormatCombined Format = "combined" // nginx's combined log format, optionally with $request_time
	FormatEnvoy    Format = "envoy"    // Envoy's JSON access log
)

// ReadOptions says how to read a log.
type ReadOptions struct {
	// Format is the log's format (FormatAuto: from its first line).
	Format Format
	// TenantField names the Envoy JSON field that holds the tenant (say
	// "x_api_key" for %REQ(X-API-KEY)%). Empty: no tenant.
	TenantField string
}

// Stats counts what a read found.
type Stats struct {
	Format Format
	// Lines read, requests kept, lines of other kinds skipped (sluice's
	// log mixes in its other lines), and lines that did not parse.
	Lines, Requests, Skipped, Malformed int64
	// FirstMalformed is the first malformed line's number and why.
	FirstMalformed string
	// Suppressed is the rejections a sampled sluice log counted without a
	// line of their own: they cannot be replayed.
	Suppressed int64
}

// ReadFile reads the log at path, gzip-compressed or not; see Read.
func ReadFile(path string, opts ReadOptions) ([]Record, Stats, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, Stats{}, err
	}
	defer f.Close()
	// A rotated log is often gzip-compressed: read through it.
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, Stats{}, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	recs, st, err := Read(r, opts)
	if err != nil {
		return nil, st, fmt.Errorf("%s: %w", path, err)
	}
	return recs, st, nil
}

// maxLine bounds one log line.
const maxLine = 1 << 20

// MaxDuration is the longest recorded duration a line may carry: a line
// with a longer one (or a negative one) is malformed, not a request that
// held its slot for years.
const MaxDuration = 24 * time.Hour

// instant is t in Unix nanoseconds, for times from 1970 to 2261 (what an
// int64 of nanoseconds holds; two of them never differ by more).
func instant(t time.Time) (int64, error) {
	if y := t.Year(); y < 1970 || y > 2261 {
		return 0, fmt.Errorf("time %s: outside 1970 to 2261", t.Format(time.RFC3339))
	}
	return t.UnixNano(), nil
}

// seconds turns a recorded duration of v units into a Duration, refusing
// a negative one, one past MaxDuration, and NaN.
func seconds(v float64, unit time.Duration) (time.Duration, error) {
	if !(v >= 0 && v*float64(unit) <= float64(MaxDuration)) {
		return 0, fmt.Errorf("duration %g%s: want 0 to %v", v, map[time.Duration]string{time.Second: "s", time.Millisecond: "ms", time.Nanosecond: "ns"}[unit], MaxDuration)
	}
	return time.Duration(v * float64(unit)), nil
}

// Read reads every request of a log, sorted by arrival. A line that does
// not parse is counted (Stats.Malformed) and skipped; a log with no request
// at all is an error.
func Read(r io.Reader, opts ReadOptions) ([]Record, Stats, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	st := Stats{Format: opts.Format}
	var recs []Record
	var parse func([]byte, *Record, *Stats) (bool, error)
	var buf []byte
	for {
		raw, tooLong, err := nextLine(br, buf[:0])
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, st, fmt.Errorf("line %d: %w", st.Lines+1, err)
		}
		buf = raw
		line := bytes.TrimSpace(raw)
		st.Lines++
		if tooLong {
			if st.Malformed == 0 {
				st.FirstMalformed = fmt.Sprintf("line %d: longer than %d bytes: not an access log line", st.Lines, maxLine)
			}
			st.Malformed++
			continue
		}
		if len(line) == 0 {
			continue
		}
		if parse == nil {
			if st.Format == FormatAuto {
				st.Format = detect(line)
			}
			var err error
			if parse, err = parser(st.Format, opts); err != nil {
				return nil, st, err
			}
		}
		var rec Record
		ok, err := parse(line, &rec, &st)
		switch {
		case err != nil:
			if st.Malformed == 0 {
				st.FirstMalformed = fmt.Sprintf("line %d: %v", st.Lines, err)
			}
			st.Malformed++
		case !ok:
			st.Skipped++
		default:
			recs = append(recs, rec)
		}
	}
	st.Requests = int64(len(recs))
	if len(recs) == 0 {
		if st.FirstMalformed != "" {
			return nil, st, fmt.Errorf("no request read (%s format); %s", st.Format, st.FirstMalformed)
		}
		if st.Format == FormatAuto {
			return nil, st, errors.New("no request read: the log is empty")
		}
		return nil, st, fmt.Errorf("no request read (%s format)", st.Format)
	}
	if st.Format == FormatCombined {
		// $time_local is when the request ended, in whole seconds: spread
		// each second's requests over it, then go back by each duration.
		spreadSeconds(recs)
		for i := range recs {
			recs[i].At -= int64(max(recs[i].Duration, 0))
		}
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].At < recs[j].At })
	return recs, st, nil
}

// nextLine reads the next line into buf, without its end of line; a line
// longer than maxLine is read past whole and returned as tooLong (what
// fits of it), so that one such line is a malformed line, not the end of
// the log. err is io.EOF after the last line.
func nextLine(br *bufio.Reader, buf []byte) (line []byte, tooLong bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) <= maxLine {
			buf = append(buf, frag...)
		} else {
			tooLong = true
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && (len(buf) > 0 || tooLong):
			return buf, tooLong, nil
		case err != nil:
			return buf, tooLong, err
		}
		return bytes.TrimSuffix(buf, []byte("\n")), tooLong, nil
	}
}

// detect names the format of a log from its first line.
func detect(line []byte) Format {
	switch {
	case line[0] == '{' && bytes.Contains(line, []byte(`"msg":`)):
		return FormatSluice // slog's JSON: the proxy's other lines come first
	case line[0] == '{':
		return FormatEnvoy
	case bytes.HasPrefix(line, []byte("time=")):
		return FormatSluice
	}
	return FormatCombined
}

func parser(f Format, opts ReadOptions) (func([]byte, *Record, *Stats) (bool, error), error) {
	switch f {
	case FormatSluice:
		return parseSluice, nil
	case FormatCombined:
		return parseCombined, nil
	case FormatEnvoy:
		return func(line []byte, rec *Record, _ *Stats) (bool, error) { return parseEnvoy(line, rec, opts.TenantField) }, nil
	}
	return nil, fmt.Errorf("unknown log format %q (want sluice, combined or envoy)", f)
}

// sluiceLine is an access line of sluice's JSON log.
type sluiceLine struct {
	Time       string `json:"time"`
	Msg        string `json:"msg"`
	Decision   string `json:"decision"`
	Method     string `json:"method"`
	Path       string `json:"path"`
	Status     int    `json:"status"`
	Reason     string `json:"reason"`
	Gate       string `json:"gate"`
	Remote     string `json:"remote"`
	Cost       int64  `json:"cost"`
	Tenant     string `json:"tenant"`
	Duration   int64  `json:"duration"` // ns
	Wait       int64  `json:"wait"`     // ns
	Suppressed int64  `json:"suppressed"`
}

// parseSluice reads one line of sluice's access log, JSON or text. Lines
// that are not access lines (msg other than "request") are skipped.
func parseSluice(line []byte, rec *Record, st *Stats) (bool, error) {
	var l sluiceLine
	var dur time.Duration = -1
	var wait time.Duration
	if line[0] == '{' {
		if err := json.Unmarshal(line, &l); err != nil {
			// Another line of the service's (one that shares the logger)
			// may hold a field of an access line's name with another type:
			// it is skipped, not malformed.
			var other struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal(line, &other) == nil && other.Msg != "request" {
				return false, nil
			}
			return false, err
		}
		var err error
		if l.Decision == "admitted" {
			if dur, err = seconds(float64(l.Duration), time.Nanosecond); err != nil {
				return false, err
			}
		}
		if wait, err = seconds(float64(l.Wait), time.Nanosecond); err != nil {
			return false, fmt.Errorf("wait: %v", err)
		}
	} else {
		var err error
		if dur, wait, err = parseLogfmt(line, &l); err != nil {
			return false, err
		}
	}
	if l.Msg != "request" {
		return false, nil
	}
	at, err := time.Parse(time.RFC3339Nano, l.Time)
	if err != nil {
		return false, fmt.Errorf("time %q: %v", l.Time, err)
	}
	ns, err := instant(at)
	if err != nil {
		return false, err
	}
	if dur > MaxDuration {
		return false, fmt.Errorf("duration %v: want 0 to %v", dur, MaxDuration)
	}
	if wait < 0 || wait > MaxDuration {
		return false, fmt.Errorf("wait %v: want 0 to %v", wait, MaxDuration)
	}
	*rec = Record{At: ns - int64(wait), Method: l.Method, Path: l.Path, Tenant: l.Tenant, Remote: l.Remote, Status: l.Status,
		Duration: -1, Cost: l.Cost, Wait: wait}
	switch l.Decision {
	case "admitted":
		rec.Decision, rec.Duration = Admitted, max(dur, 0)
		rec.At -= int64(rec.Duration) // the line is written when the request ends
	case "rejected":
		rec.Decision, rec.Gate, rec.Reason = Rejected, l.Gate, l.Reason
		st.Suppressed += l.Suppressed
	default:
		return false, fmt.Errorf("decision %q", l.Decision)
	}
	if rec.Method == "" || rec.Path == "" {
		return false, errors.New("no method or path")
	}
	return true, nil
}

// parseLogfmt reads the text form of sluice's log (key=value, values with
// spaces quoted) into l, and the duration and the wait (Go duration
// strings; -1 and 0 when absent).
func parseLogfmt(line []byte, l *sluiceLine) (dur, wait time.Duration, err error) {
	dur = time.Duration(-1)
	s := string(line)
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return 0, 0, fmt.Errorf("no key=value at %q", truncate(s))
		}
		key := s[:eq]
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return 0, 0, fmt.Errorf("%s: %v", key, err)
			}
			val, _ = strconv.Unquote(q)
			s = s[len(q):]
		} else {
			end := strings.IndexByte(s, ' ')
			if end < 0 {
				end = len(s)
			}
			val, s = s[:end], s[end:]
		}
		if err := l.set(key, val, &dur, &wait); err != nil {
			return 0, 0, fmt.Errorf("%s=%q: %v", key, val, err)
		}
	}
	return dur, wait, nil
}

// set stores the logfmt field key=val in l, or in dur and wait.
func (l *sluiceLine) set(key, val string, dur, wait *time.Duration) (err error) {
	switch key {
	case "time":
		l.Time = val
	case "msg":
		l.Msg = val
	case "decision":
		l.Decision = val
	case "method":
		l.Method = val
	case "path":
		l.Path = val
	case "reason":
		l.Reason = val
	case "gate":
		l.Gate = val
	case "remote":
		l.Remote = val
	case "tenant":
		l.Tenant = val
	case "status":
		l.Status, err = strconv.Atoi(val)
	case "cost":
		l.Cost, err = strconv.ParseInt(val, 10, 64)
	case "suppressed":
		l.Suppressed, err = strconv.ParseInt(val, 10, 64)
	case "duration":
		if *dur, err = time.ParseDuration(val); err == nil && *dur < 0 {
			err = fmt.Errorf("duration %v: want 0 to %v", *dur, MaxDuration) // not the -1 of none
		}
	case "wait":
		*wait, err = time.ParseDuration(val)
	}
	return err
}

// combined matches nginx's combined format, with an optional
// $request_time (seconds, milliseconds resolution) after it.
var combined = regexp.MustCompile(`^(\S+) \S+ (\S+) \[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) \S+ "(?:[^"\\]|\\.)*" "(?:[^"\\]|\\.)*"(?: (\d+(?:\.\d+)?))?`)

// parseCombined reads one line of nginx's combined log format.
func parseCombined(line []byte, rec *Record, _ *Stats) (bool, error) {
	m := combined.FindSubmatch(line)
	if m == nil {
		return false, fmt.Errorf("not the combined format: %q", truncate(string(line)))
	}
	at, err := time.Parse("02/Jan/2006:15:04:05 -0700", string(m[3]))
	if err != nil {
		return false, fmt.Errorf("time %q: %v", m[3], err)
	}
	ns, err := instant(at)
	if err != nil {
		return false, err
	}
	status, _ := strconv.Atoi(string(m[6]))
	*rec = Record{At: ns, Method: string(m[4]), Path: pathOnly(string(m[5])), Remote: string(m[1]), Status: status, Duration: -1}
	if u := string(m[2]); u != "-" {
		rec.Tenant = u
	}
	if len(m[7]) > 0 {
		secs, err := strconv.ParseFloat(string(m[7]), 64)
		if err != nil {
			return false, fmt.Errorf("request_time %q: %v", m[7], err)
		}
		if rec.Duration, err = seconds(secs, time.Second); err != nil { // Read moves At back by it
			return false, err
		}
	}
	return true, nil
}

// parseEnvoy reads one line of Envoy's JSON access log.
func parseEnvoy(line []byte, rec *Record, tenantField string) (bool, error) {
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		return false, err
	}
	str := func(keys ...string) string {
		for _, k := range keys {
			if v, ok := m[k]; ok && v != nil {
				switch v := v.(type) {
				case string:
					if v != "-" {
						return v
					}
				case float64:
					return strconv.FormatFloat(v, 'f', -1, 64)
				}
			}
		}
		return ""
	}
	start := str("start_time", "START_TIME")
	at, err := time.Parse(time.RFC3339Nano, start)
	if err != nil {
		return false, fmt.Errorf("start_time %q: %v", start, err)
	}
	ns, err := instant(at)
	if err != nil {
		return false, err
	}
	*rec = Record{At: ns, Method: str("method", ":method"), Path: pathOnly(str("path", ":path", "x_envoy_original_path")),
		Remote: str("downstream_remote_address", "x_forwarded_for", "downstream_direct_remote_address"), Duration: -1}
	if rec.Method == "" || rec.Path == "" {
		return false, errors.New("no method or path")
	}
	rec.Status, _ = strconv.Atoi(str("response_code", "status"))
	if d := str("duration"); d != "" {
		ms, err := strconv.ParseFloat(d, 64)
		if err != nil {
			return false, fmt.Errorf("duration %q: %v", d, err)
		}
		if rec.Duration, err = seconds(ms, time.Millisecond); err != nil {
			return false, err
		}
	}
	if tenantField != "" {
		rec.Tenant = str(tenantField)
	}
	return true, nil
}

// spreadSeconds spreads the requests of each whole second evenly over it:
// nginx's $time_local has no fraction, and a second's requests all at its
// start would burst where the traffic did not.
func spreadSeconds(recs []Record) {
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].At < recs[j].At })
	for i := 0; i < len(recs); {
		j := i
		for j < len(recs) && recs[j].At == recs[i].At {
			j++
		}
		n := int64(j - i)
		for k := i; k < j; k++ {
			recs[k].At += int64(k-i) * int64(time.Second) / n
		}
		i = j
	}
}

// pathOnly is a request target without its query.
func pathOnly(target string) string {
	if i := strings.IndexByte(target, '?'); i >= 0 {
		return target[:i]
	}
	return target
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
