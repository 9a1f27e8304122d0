package rls

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/internal/fakeclock"
)

// FuzzConfig: no file makes Parse, IsConfig, New or a lookup panic; a
// refused file has a message naming the file.
func FuzzConfig(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"domain: d\n", "descriptors:\n", "'''\n", "0.25: x\n", "domain: d\ndescriptors:\n  - a\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: foo}\n",
		"a: &a {domain: d}\nb: *a\n<<: *a\n", "domain: d\ndescriptors: &x\n  - key: k\n    descriptors: *x\n",
		conformanceConfig, extConfig,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		IsConfig(data)
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		s, err := New(c, Options{MaxKeys: 64, Clock: fakeclock.New(sec(1234)), Registry: prometheus.NewRegistry(), Headers: HeadersDraft})
		if err != nil {
			return // e.g. a burst the store cannot hold: an error, not a panic
		}
		for _, dom := range c.Domains() {
			for _, r := range c.Rules(dom) {
				_ = r.String()
				// A descriptor down the rule's own path, with made-up values.
				var es []Entry
				for _, seg := range strings.Split(r.Path, ".") {
					k, v, _ := strings.Cut(seg, "_")
					es = append(es, Entry{Key: k, Value: v})
				}
				if len(es) > DefaultMaxEntries {
					es = es[:DefaultMaxEntries]
				}
				c.Lookup(dom, es)
				for range 2 {
					s.ShouldRateLimit(context.Background(), &Request{Domain: dom, Descriptors: []Descriptor{{Entries: es}, dneg(1, es[0].Key, es[0].Value)}})
				}
			}
		}
	})
}

// FuzzJSON: no body makes DecodeRequest, ShouldRateLimit, EncodeResponse
// or the handler panic; a decoded request answers or fails with
// ErrInvalid, and every answer is valid JSON.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"a"}]}]}`,
		`{"domain":"edge","hits_addend":3,"descriptors":[{"entries":[{"key":"path","value":"/x"}],"hitsAddend":"0"}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant"}],"limit":{"requestsPerUnit":1,"unit":"HOUR"},"isNegativeHits":true}]}`,
		`{"domain":"ext","descriptors":[{"entries":[{"key":"upload","value":"u"}]},{"entries":[{"key":"upload","value":"u"}],"is_negative_hits":true,"hits_addend":"1"}]}`,
		`{"domain":"ext","descriptors":[{"entries":[{"key":"api_key","value":"k"}],"hitsAddend":1e3}]}`,
		`{"domain":"","descriptors":null}`, `[]`, `null`, `{"domain":"edge","descriptors":[{}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"k"}],"limit":{"unit":7}}]}`,
	} {
		f.Add([]byte(s))
	}
	cfg, err := Join(mustParse(f, conformanceConfig), mustParse(f, extConfig))
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(cfg, Options{MaxKeys: 256, Clock: fakeclock.New(sec(1234)), Registry: prometheus.NewRegistry(), Headers: HeadersDraft})
	if err != nil {
		f.Fatal(err)
	}
	h := &JSONHandler{Service: s}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err == nil {
			resp, err := s.ShouldRateLimit(context.Background(), req)
			if err != nil && !strings.HasPrefix(err.Error(), ErrInvalid.Error()) {
				t.Fatalf("%v", err)
			}
			if err == nil {
				if len(resp.Statuses) != len(req.Descriptors) {
					t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
				}
				if out := EncodeResponse(resp); !json.Valid(out) {
					t.Fatalf("invalid JSON %q", out)
				}
			}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(string(data))))
		if rec.Code == http.StatusOK || rec.Code == http.StatusTooManyRequests {
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%d with invalid JSON %q", rec.Code, rec.Body.Bytes())
			}
		}
	})
}

// FuzzDecodeRequest: no body makes DecodeRequest panic, and a body it
// takes is UTF-8 and decodes again to the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"domain":"edge","hitsAddend":4,"descriptors":[{"entries":[{"key":"tenant","value":"a"}],"limit":{"requestsPerUnit":1,"unit":"HOUR"}}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"k","key":"j"}]}]}`,
		`{"DOMAIN":"x"}`, `[]`, `{"domain":{"domain":1}}`, `{"descriptors":[[],{}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: %v does not wrap ErrInvalid", data, err)
			}
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("%q: not UTF-8, taken", data)
		}
		again, err := DecodeRequest(data)
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("%q: decoded twice differently: %v", data, err)
		}
	})
}
