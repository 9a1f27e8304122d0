package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// A cheating client's thousands of repeated names are put back in order
// for maxRepeatedNames of them only (each name restored costs passes over
// the whole header: without the bound, a 16 KiB head of repeated names
// made every request quadratic), and those are put back whole.
func TestRepeatedFieldsAreBounded(t *testing.T) {
	var h fasthttp.RequestHeader
	h.SetRequestURI("/")
	h.Add("Connection", "keep-alive")
	for i := range 1000 {
		h.Add(fmt.Sprintf("A%d", i), "x")
	}
	for i := 1000 - 1; i >= 0; i-- { // the y of A0 last: the first delete moves it before its x
		h.Add(fmt.Sprintf("A%d", i), "y")
	}
	fs := repeatedFields(&h)
	names := map[string]bool{}
	for _, f := range fs {
		names[string(f.name)] = true
	}
	if len(names) != maxRepeatedNames || len(fs) != 2*maxRepeatedNames {
		t.Fatalf("%d fields of %d names noted, want %d of %d", len(fs), len(names), 2*maxRepeatedNames, maxRepeatedNames)
	}
	h.Del("Connection") // moves the y of A0 first
	for i := range maxRepeatedNames - 1 {
		h.Del(fmt.Sprintf("A%d", 100+i)) // each moves the last field (the y of A1, A2...) forward
	}
	restoreOrder(&h, fs)
	for n := range names {
		var got []string
		for _, v := range h.PeekAll(n) {
			got = append(got, string(v))
		}
		if strings.Join(got, ",") != "x,y" {
			t.Errorf("%s: fields %q after the deletions, want x,y", n, got)
		}
	}
}
