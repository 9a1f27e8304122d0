package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// stepTrace is one matrix step, second by second: what the callers got
// and what the proxy's gates said.
type stepTrace struct {
	begin time.Time
	stop  chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	secs  []*traceSecond
	gates []json.RawMessage // the proxy's /v1/gates at the end of each second
}

// traceSecond is what the callers got in one second of a step (by when
// the request was sent).
type traceSecond struct {
	Sent    int            `json:"sent"`
	Good    int            `json:"good"`
	Late    int            `json:"late"`
	Refused map[string]int `json:"refused,omitempty"` // by "gate/reason"
}

// traceStep starts reading st's gates once a second.
func traceStep(st *stack) *stepTrace {
	tr := &stepTrace{begin: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		c := http.Client{Timeout: time.Second}
		for {
			select {
			case <-tr.stop:
				return
			case <-t.C:
			}
			var raw json.RawMessage
			req, _ := http.NewRequest(http.MethodGet, "http://"+st.admin+"/v1/gates", nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			if resp, err := c.Do(req); err == nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				if json.Valid(b) {
					raw = b
				}
			}
			tr.mu.Lock()
			tr.gates = append(tr.gates, raw)
			tr.mu.Unlock()
		}
	}()
	return tr
}

// count books one answer; a nil trace books nothing.
func (tr *stepTrace) count(r *vegeta.Result, begin time.Time, deadline time.Duration) {
	if tr == nil {
		return
	}
	i := max(int(r.Timestamp.Sub(begin)/time.Second), 0)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for len(tr.secs) <= i {
		tr.secs = append(tr.secs, &traceSecond{})
	}
	s := tr.secs[i]
	s.Sent++
	switch {
	case r.Code == http.StatusTooManyRequests || r.Code == http.StatusServiceUnavailable:
		var body struct {
			Error struct {
				Reason string `json:"reason"`
				Gate   string `json:"gate"`
			} `json:"error"`
		}
		_ = json.Unmarshal(r.Body, &body)
		if s.Refused == nil {
			s.Refused = map[string]int{}
		}
		s.Refused[body.Error.Gate+"/"+body.Error.Reason]++
	case r.Code == http.StatusOK && r.Latency <= deadline:
		s.Good++
	default:
		s.Late++
	}
}

// write stops the gate reader and writes a JSON line per second.
func (tr *stepTrace) write(w io.Writer, c *MatrixCell) {
	close(tr.stop)
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	enc := json.NewEncoder(w)
	for i, s := range tr.secs {
		line := struct {
			Cell string          `json:"cell"`
			Sec  int             `json:"sec"`
			Load float64         `json:"load"`
			Got  *traceSecond    `json:"got"`
			Gate json.RawMessage `json:"gates,omitempty"`
		}{Cell: fmt.Sprintf("%dw x %gms, deadline %gms", c.Workers, c.ServiceMs, c.DeadlineMs), Sec: i, Load: c.Load, Got: s}
		if i < len(tr.gates) {
			line.Gate = tr.gates[i]
		}
		_ = enc.Encode(line)
	}
}
