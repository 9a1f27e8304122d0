package lease

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fakeclock"
)

// An allocator that stops answering (its Redis down) is told in the log:
// a warning at the first failed refresh, again every outageRetell while
// it lasts, and a line when it answers again; nothing was logged, and
// the gate went on to its failure mode silently.
func TestAllocatorOutageIsLogged(t *testing.T) {
	var buf bytes.Buffer
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	h := &holder{opts: GateOptions{Budget: "api", Client: "p1", Clock: fakeclock.New(1)}}
	var o outage
	t0 := time.Unix(1e9, 0)
	down := errors.New("dial tcp: connection refused")
	for _, c := range []struct {
		at   time.Duration
		err  error
		want string // "": nothing logged
	}{
		{0, down, "level=WARN msg=\"lease: the allocator did not answer a refresh"},
		{10 * time.Second, down, ""},
		{20 * time.Second, down, ""},
		{31 * time.Second, down, "level=WARN msg=\"lease: the allocator still does not answer\" budget=api client=p1 for=31s refreshes_failed=4"},
		{40 * time.Second, down, ""},
		{45 * time.Second, nil, "level=INFO msg=\"lease: the allocator answers again\" budget=api client=p1 after=45s refreshes_failed=5"},
		{50 * time.Second, nil, ""},
		// It comes and goes: a new outage within 30 s of the last warning
		// is told with the next one, and its end not at all.
		{52 * time.Second, down, ""},
		{53 * time.Second, nil, ""},
		{70 * time.Second, down, "brief_outages_untold=1"},
		{71 * time.Second, nil, "answers again"},
	} {
		buf.Reset()
		o.tell(h, c.err, t0.Add(c.at))
		if got := buf.String(); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("at %v: logged %q, want %q", c.at, got, c.want)
		}
	}
}
