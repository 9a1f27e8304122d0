package httpcore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"io"
	"log/slog"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

type accessLine struct {
	Msg        string `json:"msg"`
	Decision   string `json:"decision"`
	Method     string `json:"method"`
	Path       string `json:"path"`
	Status     int    `json:"status"`
	Reason     string `json:"reason"`
	Gate       string `json:"gate"`
	RequestID  string `json:"request_id"`
	Tenant     string `json:"tenant"`
	Suppressed int64  `json:"suppressed"`
	Duration   int64  `json:"duration"`
}

func accessLines(t *testing.T, buf *bytes.Buffer) []accessLine {
	t.Helper()
	var out []accessLine
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var a accessLine
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		out = append(out, a)
	}
	buf.Reset()
	return out
}

// The access log writes a line per admitted request, and per reason at
// most RejectsPerSecond rejection lines a second of the chain's clock; the
// rejections left out are counted on the next line of their reason. Paths
// lose their query string; tenants show only through TenantLabel.
func TestAccessLogSamplesRejections(t *testing.T) {
	clk := fakeclock.New(int64(10 * time.Second))
	r, _ := limit.ParseRate("2/h")
	tb, _ := limit.NewTokenBucket(r, 2)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, g)
	var buf bytes.Buffer
	al := &httpcore.AccessLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), RejectsPerSecond: 2,
		TenantLabel: func(t string) string { return "label-of-" + t[:min(1, len(t))] }}
	mw, err := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: noJitter, AccessLog: al})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clk.Advance(30 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(n int) []int {
		var codes []int
		for range n {
			req := httptest.NewRequest("GET", "/v1/routes/7?api_key=SECRET", nil)
			req.Header.Set("X-Api-Key", "acme-secret-key")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			codes = append(codes, rec.Code)
		}
		return codes
	}
	send(2) // the burst: admitted
	lines := accessLines(t, &buf)
	if len(lines) != 2 || lines[0].Decision != "admitted" || lines[0].Status != 201 || lines[0].Path != "/v1/routes/7" ||
		lines[0].Duration != int64(30*time.Millisecond) || lines[0].Tenant != "label-of-a" {
		t.Fatalf("admitted lines: %+v", lines)
	}
	// Ten rejections in one second: two lines.
	send(10)
	lines = accessLines(t, &buf)
	if len(lines) != 2 || lines[0].Decision != "rejected" || lines[0].Status != 429 || lines[0].Reason != "policy_rate" ||
		lines[0].Gate != "request-rate" || lines[0].RequestID == "" || lines[0].Suppressed != 0 {
		t.Fatalf("first second: %+v", lines)
	}
	// The next second: the eight left out ride on the first line.
	clk.Advance(time.Second)
	send(3)
	lines = accessLines(t, &buf)
	if len(lines) != 2 || lines[0].Suppressed != 8 || lines[1].Suppressed != 0 {
		t.Fatalf("next second: %+v", lines)
	}
	// An invalid request is another reason: sampled on its own.
	req := httptest.NewRequest("GET", "/v1/routes/7", nil)
	req.Header.Set("Sluice-Cost", "x")
	mw.Invalid(httptest.NewRecorder(), req, "body too large")
	lines = accessLines(t, &buf)
	if len(lines) != 1 || lines[0].Reason != "invalid" || lines[0].Status != 400 {
		t.Fatalf("invalid: %+v", lines)
	}
	clk.Advance(time.Second)
	send(1)
	lines = accessLines(t, &buf)
	if len(lines) != 1 || lines[0].Suppressed != 1 {
		t.Fatalf("third second: %+v", lines)
	}
	for _, s := range []string{"SECRET", "acme-secret-key"} {
		if strings.Contains(buf.String(), s) {
			t.Fatalf("%s logged", s)
		}
	}
}

// RejectsPerSecond < 0 logs every rejection; TenantLabel nil leaves
// tenants out.
func TestAccessLogEveryRejection(t *testing.T) {
	r, _ := limit.ParseRate("1/h")
	tb, _ := limit.NewTokenBucket(r, 1)
	clk := fakeclock.New(1)
	g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, g)
	var buf bytes.Buffer
	mw, _ := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: noJitter,
		AccessLog: &httpcore.AccessLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), RejectsPerSecond: -1}})
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 6 {
		req := httptest.NewRequest("GET", "/x", nil)
		req.Header.Set("X-Api-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	lines := accessLines(t, &buf)
	if len(lines) != 6 || lines[0].Status != 200 || lines[5].Status != 429 || lines[5].Tenant != "" {
		t.Fatalf("%+v", lines)
	}
}

// rfWriter is a ResponseWriter with io.ReaderFrom, as net/http's is.
type rfWriter struct {
	*httptest.ResponseRecorder
	readFrom int
}

func (w *rfWriter) ReadFrom(src io.Reader) (int64, error) {
	w.readFrom++
	return io.Copy(w.ResponseRecorder, src)
}

// The status logged is the final one: a 103 Early Hints sent ahead of a
// 500 is not it. A body copied into the wrapped writer reaches the
// server's own io.ReaderFrom (sendfile, for net/http's).
func TestAccessLogFinalStatusAndReadFrom(t *testing.T) {
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)})
	var buf bytes.Buffer
	mw, _ := httpcore.New(chain, httpcore.Config{AccessLog: &httpcore.AccessLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil))}})
	mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusInternalServerError)
	})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/hints", nil))
	w := &rfWriter{ResponseRecorder: httptest.NewRecorder()}
	mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.CopyN(w, strings.NewReader("file body"), 9) // as http.ServeContent copies
	})).ServeHTTP(w, httptest.NewRequest("GET", "/file", nil))
	lines := accessLines(t, &buf)
	if len(lines) != 2 || lines[0].Status != 500 || lines[1].Status != 200 {
		t.Fatalf("%+v", lines)
	}
	if w.readFrom != 1 || w.Body.String() != "file body" {
		t.Fatalf("ReadFrom calls %d, body %q", w.readFrom, w.Body.String())
	}
}

// A decision that waited in a gate's queue logs how long (wait, ns), so
// the request's arrival is its line's time less duration and wait: an
// admitted one that waited for the slot another held, and one turned away
// when its context ended while it waited. The waits are bounded below only
// (a busy host makes them longer, and can make a decision that did not
// wait take long enough to log one).
func TestAccessLogWait(t *testing.T) {
	c, _ := limit.NewConcurrency(1)
	pool, _ := gate.NewInFlight("worker-pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	q, _ := queue.New("worker-pool", pool, queue.Options{MaxWait: time.Minute})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, q)
	var buf logbuf.Buffer
	mw, _ := httpcore.New(chain, httpcore.Config{Jitter: noJitter,
		AccessLog: &httpcore.AccessLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), RejectsPerSecond: -1}})
	entered, release := make(chan struct{}), make(chan struct{})
	h := mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold") {
			entered <- struct{}{}
			<-release
		}
	}))
	serve := func(ctx context.Context, path string) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil).WithContext(ctx))
		}()
		return done
	}
	waiting := func() int {
		b, _ := json.Marshal(q.ReportState(clock.Now()))
		var st struct{ Waiting int }
		json.Unmarshal(b, &st)
		return st.Waiting
	}
	bg := context.Background()
	first := serve(bg, "/hold")
	<-entered
	second := serve(bg, "/second")
	for waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	release <- struct{}{}
	<-first
	<-second
	held := serve(bg, "/hold2")
	<-entered
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	third := serve(ctx, "/turned-away")
	for waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	cancel() // its context ends while it waits
	<-third
	release <- struct{}{}
	<-held
	waits := map[string]int64{}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var a struct {
			Path, Decision string
			Wait           int64
		}
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatal(err)
		}
		waits[a.Path+" "+a.Decision] = a.Wait
	}
	if len(waits) != 4 {
		t.Errorf("lines are missing: %v", waits)
	}
	if w := waits["/second admitted"]; w < int64(30*time.Millisecond) {
		t.Errorf("the second waited at least 30 ms for its slot; logged %v (%v)", time.Duration(w), waits)
	}
	if w := waits["/turned-away rejected"]; w < int64(30*time.Millisecond) {
		t.Errorf("the third waited at least 30 ms before it was turned away; logged %v (%v)", time.Duration(w), waits)
	}
}
