package whatif

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leakcheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }

func at(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UnixNano()
}

// Each format's fixture reads into the same kind of records: the arrival
// (an end time moved back by the duration where the log writes the end),
// method, path without its query, client, tenant, status, duration and,
// from sluice's log, the decision; lines of other kinds are skipped and
// malformed ones counted.
func TestReadFormats(t *testing.T) {
	for _, c := range []struct {
		file   string
		opts   ReadOptions
		format Format
		want   []Record
		stats  Stats
	}{
		{"combined.log", ReadOptions{}, FormatCombined, []Record{
			{At: at("2026-12-06T01:00:00Z") - int64(12*time.Millisecond), Method: "GET", Path: "/v1/routes/42", Tenant: "alice", Remote: "192.0.2.10", Status: 200, Duration: 12 * time.Millisecond},
			{At: at("2026-12-06T01:00:00.5Z") - int64(20*time.Millisecond), Method: "GET", Path: "/v1/routes/43", Tenant: "alice", Remote: "192.0.2.10", Status: 200, Duration: 20 * time.Millisecond},
			{At: at("2026-12-06T01:00:01Z") - int64(time.Millisecond), Method: "POST", Path: "/v1/routes", Remote: "192.0.2.11", Status: 429, Duration: time.Millisecond},
			{At: at("2026-12-06T01:00:02Z"), Method: "GET", Path: "/v1/analytics/daily", Tenant: "bob", Remote: "2001:db8::1", Status: 503, Duration: -1},
		}, Stats{Lines: 5, Requests: 4, Malformed: 1}},
		{"envoy.jsonl", ReadOptions{TenantField: "x_api_key"}, FormatEnvoy, []Record{
			{At: at("2026-12-06T01:00:00.125Z"), Method: "GET", Path: "/v1/routes/42", Tenant: "alice", Remote: "192.0.2.10:51234", Status: 200, Duration: 12 * time.Millisecond},
			{At: at("2026-12-06T01:00:00.25Z"), Method: "POST", Path: "/v1/routes", Remote: "192.0.2.11:40000", Status: 429, Duration: time.Millisecond},
			{At: at("2026-12-06T01:00:01Z"), Method: "GET", Path: "/v1/analytics/daily", Tenant: "bob", Remote: "[2001:db8::1]:443", Status: 503},
		}, Stats{Lines: 4, Requests: 3, Malformed: 1}},
		{"sluice.log", ReadOptions{}, FormatSluice, []Record{
			{At: at("2026-12-06T01:00:00.1Z"), Method: "GET", Path: "/v1/routes/42", Tenant: "t-2bd806c97f0e", Remote: "192.0.2.10:51234", Status: 200, Duration: 12 * time.Millisecond, Cost: 1, Decision: Admitted},
			{At: at("2026-12-06T01:00:00.13Z"), Method: "POST", Path: "/v1/routes", Tenant: "t-81b637d8fcd2", Remote: "192.0.2.11:40000", Status: 429, Duration: -1, Cost: 5, Decision: Rejected, Gate: "request-rate", Reason: "policy_rate"},
			// Turned away after 200 ms in a wait queue: it arrived then.
			{At: at("2026-12-06T01:00:00.25Z"), Method: "GET", Path: "/v1/analytics/daily", Tenant: "t-2bd806c97f0e", Remote: "192.0.2.12:40001", Status: 503, Duration: -1, Cost: 1, Decision: Rejected, Gate: "worker-pool", Reason: "queue", Wait: 200 * time.Millisecond},
		}, Stats{Lines: 5, Requests: 3, Skipped: 1, Malformed: 1, Suppressed: 3}},
		// JSON, as sluice demo --scenario incident --record writes it: the
		// proxy's own lines come first.
		{"sluice.jsonl", ReadOptions{}, FormatSluice, []Record{
			{At: at("2026-12-06T01:00:00.1Z"), Method: "GET", Path: "/v1/routes/42", Tenant: "t-2bd806c97f0e", Remote: "192.0.2.10:51234", Status: 200, Duration: 12 * time.Millisecond, Cost: 1, Decision: Admitted},
			{At: at("2026-12-06T01:00:00.13Z"), Method: "POST", Path: "/v1/routes", Tenant: "t-81b637d8fcd2", Remote: "192.0.2.11:40000", Status: 429, Duration: -1, Cost: 5, Decision: Rejected, Gate: "request-rate", Reason: "policy_rate"},
			// Admitted after 50 ms in a wait queue, served for 20 ms.
			{At: at("2026-12-06T01:00:00.23Z"), Method: "GET", Path: "/v1/routes/43", Tenant: "t-2bd806c97f0e", Remote: "192.0.2.10:51234", Status: 200, Duration: 20 * time.Millisecond, Cost: 1, Decision: Admitted, Wait: 50 * time.Millisecond},
		}, Stats{Lines: 5, Requests: 3, Skipped: 2}},
	} {
		t.Run(c.file, func(t *testing.T) {
			recs, st, err := ReadFile("testdata/"+c.file, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if st.Format != c.format || st.Lines != c.stats.Lines || st.Requests != c.stats.Requests || st.Skipped != c.stats.Skipped ||
				st.Malformed != c.stats.Malformed || st.Suppressed != c.stats.Suppressed || (st.Malformed > 0) != (st.FirstMalformed != "") {
				t.Errorf("stats %+v, want %+v", st, c.stats)
			}
			if fmt.Sprint(recs) != fmt.Sprint(c.want) {
				t.Errorf("records\n got %+v\nwant %+v", recs, c.want)
			}
		})
	}
}

// A log with nothing to replay, or in no known format, is an error that
// says why; an over-long line is an error, not a truncation.
func TestReadErrors(t *testing.T) {
	if _, _, err := Read(strings.NewReader("garbage\nmore garbage\n"), ReadOptions{}); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("garbage: %v", err)
	}
	if _, _, err := Read(strings.NewReader("x\n"), ReadOptions{Format: "apache"}); err == nil || !strings.Contains(err.Error(), "apache") {
		t.Errorf("unknown format: %v", err)
	}
	long := strings.Repeat("a", maxLine+10)
	if _, _, err := Read(strings.NewReader(long), ReadOptions{Format: FormatCombined}); err == nil {
		t.Error("an over-long line passed")
	}
	if _, _, err := Read(strings.NewReader(long), ReadOptions{}); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("an over-long line: %v", err)
	}
	// Between good lines it is one malformed line, not the end of the log
	// (it ended the read, and the whole replay with it).
	good := "time=2026-12-06T01:00:00.112Z level=INFO msg=request decision=admitted method=GET path=/a status=200 duration=12ms\n"
	recs, st, err := Read(strings.NewReader(good+long+"\n"+good+good), ReadOptions{})
	if err != nil || len(recs) != 3 || st.Malformed != 1 || st.Lines != 4 || !strings.Contains(st.FirstMalformed, "line 2: longer than") {
		t.Errorf("an over-long line among good ones: %d records, %+v, %v", len(recs), st, err)
	}
	// A line of the service's own that shares the logger, with a field of
	// an access line's name and another type, is skipped.
	other := `{"time":"2026-12-06T01:00:07Z","msg":"cache warm","wait":"5s","status":"ok"}` + "\n" +
		`{"time":"2026-12-06T01:00:08Z","msg":"request","decision":"rejected","method":"GET","path":"/","status":429}` + "\n"
	if recs, st, err := Read(strings.NewReader(other), ReadOptions{}); err != nil || len(recs) != 1 || st.Skipped != 1 || st.Malformed != 0 {
		t.Errorf("another line of the service's: %v %+v", err, st)
	}
	if _, _, err := Read(strings.NewReader("\n\n"), ReadOptions{}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty log: %v", err)
	}
	// Durations past a day and negative ones, and times outside what
	// nanoseconds since 1970 hold, are malformed lines, in every format:
	// not a request that holds its slot for years, nor a timeline of
	// centuries.
	for _, c := range []struct {
		format Format
		line   string
	}{
		{FormatSluice, `{"time":"2026-12-06T01:00:07Z","msg":"request","decision":"admitted","method":"GET","path":"/","status":200,"duration":1000000000000000000}`},
		{FormatSluice, `{"time":"2026-12-06T01:00:07Z","msg":"request","decision":"admitted","method":"GET","path":"/","status":200,"duration":-5}`},
		{FormatSluice, `{"time":"2026-12-06T01:00:07Z","msg":"request","decision":"rejected","method":"GET","path":"/","status":503,"wait":-5}`},
		{FormatSluice, `{"time":"2026-12-06T01:00:07Z","msg":"request","decision":"rejected","method":"GET","path":"/","status":503,"wait":"5s"}`},
		{FormatSluice, `time=2026-12-06T01:00:07Z msg=request decision=rejected method=GET path=/ status=503 wait=25h`},
		{FormatSluice, `time=2026-12-06T01:00:07Z level=INFO msg=request decision=admitted method=GET path=/ status=200 duration=2562047h`},
		{FormatSluice, `time=2026-12-06T01:00:07Z level=INFO msg=request decision=admitted method=GET path=/ status=200 duration=-5ms`},
		{FormatSluice, `{"time":"1700-01-01T00:00:00Z","msg":"request","decision":"rejected","method":"GET","path":"/","status":429}`},
		{FormatSluice, `{"time":"9999-01-01T00:00:00Z","msg":"request","decision":"rejected","method":"GET","path":"/","status":429}`},
		{FormatEnvoy, `{"start_time":"2026-12-06T01:00:00Z","method":"GET","path":"/","response_code":200,"duration":1000000000000}`},
		{FormatEnvoy, `{"start_time":"0001-01-01T00:00:00Z","method":"GET","path":"/","response_code":200,"duration":1}`},
		{FormatCombined, `192.0.2.1 - - [06/Dec/2026:01:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "-" 1000000000`},
	} {
		_, st, err := Read(strings.NewReader(c.line+"\n"), ReadOptions{Format: c.format})
		if err == nil || st.Malformed != 1 {
			t.Errorf("%.60s: %v, %+v; want a malformed line", c.line, err, st)
		}
	}
	if _, err := os.Stat("testdata/none"); err == nil {
		t.Fatal("unexpected file")
	}
	if _, _, err := ReadFile("testdata/none", ReadOptions{}); err == nil {
		t.Error("a missing file passed")
	}
}

// FuzzRead: any input reads without a panic, what it keeps is sorted by
// arrival, and it replays (the upstream fitted, and with --follow) without
// one.
func FuzzRead(f *testing.F) {
	cand := mustPolicy(f, "p.yaml", policyText("5/s"))
	for _, name := range []string{"combined.log", "envoy.jsonl", "sluice.log", "sluice.jsonl"} {
		data, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, _, err := Read(bytes.NewReader(data), ReadOptions{})
		if err != nil {
			return
		}
		for i := 1; i < len(recs); i++ {
			if recs[i].At < recs[i-1].At {
				t.Fatalf("record %d before %d", i, i-1)
			}
		}
		if len(recs) == 0 || len(recs) > 100 {
			return
		}
		for _, follow := range []bool{false, true} {
			if _, err := Replay(recs, Options{Candidate: cand, Follow: follow}); err != nil {
				t.Fatalf("follow %v: %v", follow, err)
			}
		}
	})
}

// A rotated, gzip-compressed log reads as the log it holds (it was read as
// bytes, and refused with a screenful of them).
func TestReadFileGzip(t *testing.T) {
	const src = "testdata/sluice.log"
	want, _, err := ReadFile(src, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(data)
	zw.Close()
	gz := filepath.Join(t.TempDir(), "sluice.log.1.gz")
	if err := os.WriteFile(gz, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, _, err := ReadFile(gz, ReadOptions{})
	if err != nil || len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
		t.Fatalf("%d records, %v; want the plain log's %d", len(got), err, len(want))
	}
	// A truncated one says so.
	os.WriteFile(gz, b.Bytes()[:b.Len()/2], 0o644)
	if _, _, err := ReadFile(gz, ReadOptions{}); err == nil || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("a truncated gzip log: %v", err)
	}
}

// A tenant the log names with bytes a terminal acts on is shown quoted.
func TestShownQuotesWhatATerminalActsOn(t *testing.T) {
	for in, want := range map[string]string{
		"t-2bd806c97f0e": "t-2bd806c97f0e", "émilie": "émilie",
		"\x1b[2Jx": `"\x1b[2Jx"`, "a\tb": `"a\tb"`, "\xff": `"\xff"`,
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
	}
}
