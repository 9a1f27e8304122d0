package host

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/metrics"
)

// gateState is one gate as the admin API shows it.
// Limit is the gate's quota in Unit (the burst of a bucket, the limit of a
// window or of a concurrency gate) and WindowSeconds the exact time a used
// quota takes to come back (0 for concurrency).
//
// A bucket (token_bucket, gcra) also shows in the policy's own terms:
// RatePerSecond, its sustained rate (tokens/s), and Burst (= Limit; the
// window is the time an empty bucket takes to fill).
type gateState struct {
	Name          string  `json:"name"`
	Kind          string  `json:"kind,omitempty"`
	Mode          string  `json:"mode"`
	Limit         int64   `json:"limit,omitempty"`
	WindowSeconds float64 `json:"window_seconds,omitempty"`
	RatePerSecond float64 `json:"rate_per_second,omitempty"`
	Burst         int64   `json:"burst,omitempty"`
	Unit          string  `json:"unit,omitempty"`
	// State is what a protection gate is doing now (ladder level, shed
	// fraction), for gates that report one.
	State any `json:"state,omitempty"`
}

// AdminHandler serves /metrics, /healthz, /readyz, /v1/gates and the live page.
//
//	GET  /healthz               200 while the process runs (liveness)
//	GET  /readyz                200 while serving, 503 once draining (SetReady)
//	GET  /v1/gates              every gate with its mode and quota
//	POST /v1/gates/{name}       body {"mode":"shadow"}: switch a gate's mode
//	GET  /live/                 the live page (embedded HTML, script, style)
//	GET  /v1/live?n=10          what the page polls: counts by class, the n
//	                            tenants rejected most and consuming most,
//	                            each gate's mode and state (JSON)
//	GET  /v1/live/history       the last five minutes of /v1/live, one
//	                            reading a second, oldest first
//	POST /v1/tenants/lookup     body {"labels": [...], "keys": [...]}: the
//	                            tenant behind each label, the label of each key
//	GET  /                      redirects to /live/
//
// /v1/gates and /v1/tenants/lookup require "Authorization: Bearer TOKEN"
// with token (see AdminToken); the live page and /v1/live, like /metrics,
// do not (they show tenant labels, never keys, and no quotas).
func (s *Host) AdminHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if !s.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "draining\n")
			return
		}
		io.WriteString(w, "ready\n")
	})
	s.liveHandlers(mux)
	mux.HandleFunc("GET /v1/gates", authorized(token, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.gateStates())
	}))
	mux.HandleFunc("POST /v1/gates/{name}", authorized(token, func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Mode string `json:"mode"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		err := dec.Decode(&body)
		if err == nil && dec.More() {
			err = errors.New("trailing data")
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want a JSON body {\"mode\": \"enforce|shadow|off\"}"})
			return
		}
		m, err := sluice.ParseMode(body.Mode)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		name := r.PathValue("name")
		// Under the reload lock: a reload carries run-time modes into the
		// chain it builds, so a switch must land before it reads them or
		// after it installs the new chain, never in between.
		s.mu.Lock()
		err = s.Chain().SetMode(name, m)
		s.mu.Unlock()
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		s.log.Warn("gate mode switched", "gate", name, "mode", m.String(), "remote", r.RemoteAddr)
		for _, g := range s.gateStates() {
			if g.Name == name {
				writeJSON(w, http.StatusOK, g)
				return
			}
		}
	}))
	mux.HandleFunc("POST /v1/tenants/lookup", authorized(token, s.lookupTenants))
	return mux
}

// maxLookups bounds the labels and keys of one lookup.
const maxLookups = 100

// tenantLookup is one tenant of a lookup's answer: its label and, when
// Known, its key.
type tenantLookup struct {
	Label string `json:"label"`
	Key   string `json:"key,omitempty"`
	// Known says whether the metrics hold this tenant (a label slot, or a
	// place in the live view's sketches): a label of no such tenant has no
	// key to give.
	Known bool `json:"known"`
}

// lookupTenants answers POST /v1/tenants/lookup, body
// {"labels": ["t-…"], "keys": ["…"]} (at most 100 of each): each label with
// the key of the tenant behind it, if the metrics hold it, and each key with
// its label. Keys travel in the body, never in a URL, and the answer is not
// cached; nothing of either is logged.
func (s *Host) lookupTenants(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	var body struct {
		Labels []string `json:"labels"`
		Keys   []string `json:"keys"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	err := dec.Decode(&body)
	if err == nil && dec.More() {
		err = errors.New("trailing data")
	}
	if err != nil || len(body.Labels) > maxLookups || len(body.Keys) > maxLookups {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want a JSON body {\"labels\": [\"t-…\"], \"keys\": [\"…\"]} with at most 100 of each (64 KiB)"})
		return
	}
	out := []tenantLookup{}
	for _, l := range body.Labels {
		k, ok := s.metrics.TenantKey(l)
		out = append(out, tenantLookup{Label: l, Key: k, Known: ok})
	}
	for _, k := range body.Keys {
		l := metrics.HashTenant(k)
		_, ok := s.metrics.TenantKey(l)
		out = append(out, tenantLookup{Label: l, Key: k, Known: ok})
	}
	writeJSON(w, http.StatusOK, map[string][]tenantLookup{"tenants": out})
}

func authorized(adminToken string, h http.HandlerFunc) http.HandlerFunc {
	want := []byte(adminToken)
	return func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
			w.Header().Set("Cache-Control", "no-store")
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
			return
		}
		h(w, r)
	}
}

func (s *Host) gateStates() []gateState {
	c := s.Chain()
	kinds := map[string]string{}
	s.mu.Lock()
	for _, g := range s.rt.File.Gates {
		kinds[g.Name] = g.Kind
	}
	s.mu.Unlock()
	var out []gateState
	for _, g := range c.Gates() {
		m, _ := c.Mode(g.Name())
		st := gateState{Name: g.Name(), Kind: kinds[g.Name()], Mode: m.String()}
		if a, ok := sluice.As[sluice.Advertiser](g); ok {
			p := a.Policy()
			st.Limit, st.WindowSeconds = p.Quota, p.Window.Seconds()
			st.Unit = "requests"
			if p.Unit == sluice.UnitConcurrentRequests {
				st.Unit = "concurrent-requests"
			}
			if (st.Kind == "token_bucket" || st.Kind == "gcra") && p.Window > 0 {
				st.RatePerSecond, st.Burst = float64(p.Quota)/p.Window.Seconds(), p.Quota
			}
		}
		if a, ok := sluice.As[sluice.StateReporter](g); ok {
			st.State = a.ReportState(c.Clock().Now())
		}
		out = append(out, st)
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
