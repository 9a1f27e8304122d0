package rls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Bytes that are not UTF-8 in a domain, a key or a value are refused with
// ErrInvalid (as gRPC's proto3 decoding refuses them), never a panic: the
// metrics' labels are built from them, and Prometheus panics on a label
// value that is not UTF-8.
func TestInvalidUTF8Refused(t *testing.T) {
	cfg := mustParse(t, conformanceConfig+"  - {key: detailed, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 5}}\n")
	for name, r := range map[string]*Request{
		"unknown_domain": {Domain: "\xff", Descriptors: []Descriptor{d("k", "v")}},
		"override_value": {Domain: "edge", Descriptors: []Descriptor{dover(5, Minute, "k", "\xff\xfe")}},
		"override_key":   {Domain: "edge", Descriptors: []Descriptor{dover(5, Minute, "k\xc3", "v")}},
		"detailed_value": {Domain: "edge", Descriptors: []Descriptor{d("detailed", "a\x80b")}},
	} {
		t.Run(name, func(t *testing.T) {
			s, clk := backend{name: "memory"}.server(t, cfg, Options{})
			clk.Set(sec(1200))
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				_, err = s.ShouldRateLimit(context.Background(), r)
			}()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
				t.Errorf("%v, want ErrInvalid naming UTF-8", err)
			}
			// and the Server still answers (a panic once left the metrics' mutex locked)
			done := make(chan error, 1)
			go func() {
				_, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "nowhere", Descriptors: []Descriptor{d("k", "v")}})
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the Server hangs after the call")
			}
		})
	}
}

// A permit whose release never comes is freed after ConcurrencyTTL even
// when every slot of the key is held by such permits and no other key is
// taken: the expired permits are swept before the take, not only after an
// admitted one (on memory, a key whose releases were lost stayed full
// forever).
func TestConcurrencyTTLLoneKey(t *testing.T) {
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, mustParse(t, extConfig), Options{ConcurrencyTTL: 10 * time.Second})
			run(t, s, clk, "ext", []call{
				{at: 1000, repeat: 1, descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
				{at: 1005, descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
				{at: 1020, descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("upload", "x")}, overall: CodeOverLimit},
			})
		})
	}
}
