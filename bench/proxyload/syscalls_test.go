package main

import (
	"testing"

	"go.uber.org/goleak"
)

// gnet's worker pool (ants) starts its own goroutines when the package
// loads; they are not the tests'.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"))
}

// perf stat -x, prints one line per event: value, unit, event, run time,
// share counted; events it could not count read "<not counted>".
func TestParsePerfStat(t *testing.T) {
	out := parsePerfStat(`
123,,syscalls:sys_enter_read,4003120,100.00,,
7,,syscalls:sys_enter_recvfrom,4003120,100.00,,
50,,syscalls:sys_enter_writev,4003120,100.00,,
<not counted>,,syscalls:sys_enter_sendto,0,0.00,,
4,,syscalls:sys_enter_epoll_pwait,4003120,100.00,,
2,,syscalls:sys_enter_futex,4003120,100.00,,
`)
	want := map[string]float64{"read": 130, "write": 50, "wait": 4, "futex": 2, "all": 186}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("%s: %v, want %v (all: %v)", k, out[k], v, out)
		}
	}
	if parsePerfStat("perf: not found\n") != nil {
		t.Error("counts from an output with none")
	}
}
