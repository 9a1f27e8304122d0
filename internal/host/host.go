// Package host serves a policy file the way every sluice command does: it
// builds the policy into a chain behind an httpcore.Middleware with
// Prometheus metrics, reloads it on request or when the file is replaced,
// keeps run-time mode switches across reloads, and serves the admin API
// (/metrics, /healthz, /v1/gates). `sluice proxy` (package proxy) and
// `sluice serve` (package serve) put their listeners around one Host.
package host

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/buildinfo"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/policy"
)

// Options configures a Host.
type Options struct {
	// Config is the policy file path.
	Config string
	// TokenFile, if set, is the admin token file AdminToken generated for
	// this server: Close removes it (its token dies with the process).
	TokenFile string
	// ConfigData, if set, is the policy itself (Config then only names it
	// in messages, and nothing reloads).
	ConfigData []byte
	// Logger receives operational logs. Required.
	Logger *slog.Logger
	// Clock for the chain (tests). Default: the real clock.
	Clock clock.Clock
	// Jitter spreads Retry-After values (nil: sluice.DefaultJitter; a zero
	// Jitter: exact values, for tests).
	Jitter *sluice.Jitter
	// Check, if set, is run on every policy before it serves (the first
	// and every reload); an error refuses it like an invalid file.
	Check func(*policy.File) error
	// AccessLog, if set, is the middleware's access log (its tenants
	// labelled as the metrics label them, metrics.HashTenant, unless it
	// says otherwise).
	AccessLog *httpcore.AccessLog
	// ProblemDetails answers rejections with RFC 9457 problem details
	// (httpcore.Config.ProblemDetails).
	ProblemDetails bool
	// Upstream: the policy admits requests for a separate upstream
	// (policy.Options.Upstream).
	Upstream bool
	// OnBuild, if set, is given every runtime before it serves (the first
	// and every reload; on a reload before the gates it replaces stop and
	// its own background loops start), for a caller that decides with the
	// same chain outside the middleware; an error refuses it like an
	// invalid file, and the old policy serves on untouched.
	OnBuild func(*policy.Runtime) error
}

// Host is a served policy. Its methods are safe for concurrent use.
type Host struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics.Metrics
	mw      *httpcore.Middleware

	ready    atomic.Bool            // what /readyz answers (SetReady)
	hist     history                // the live page's last readings
	drainCut *prometheus.CounterVec // requests cut by the drain grace

	mu      sync.Mutex // serializes reloads and admin mode switches
	rt      *policy.Runtime
	version string // sha256 of the file content serving now, and of the files it read (policy.File.Inputs)
	file    string // sha256 of the file content serving now
	refused string // sha256 of the last content refused (logged once)
	why     error  // why it was refused
}

// New reads, checks and builds the policy; it fails if the file is
// invalid or refused by Options.Check.
func New(opts Options) (*Host, error) {
	if al := opts.AccessLog; al != nil && al.TenantLabel == nil {
		c := *al
		c.TenantLabel = metrics.HashTenant
		opts.AccessLog = &c
	}
	reg := prometheus.NewRegistry()
	h := &Host{opts: opts, log: opts.Logger, metrics: metrics.New(metrics.Options{Registry: reg}), drainCut: newDrainCut()}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.Collector(), h.drainCut)
	data := opts.ConfigData
	if data == nil {
		var err error
		if data, err = yamlfile.ReadFile(opts.Config); err != nil {
			return nil, fmt.Errorf("policy file: %w", err)
		}
	}
	f, err := policy.Parse(opts.Config, data)
	if err != nil {
		return nil, err
	}
	if opts.Check != nil {
		if err := opts.Check(f); err != nil {
			return nil, err
		}
	}
	rt, err := policy.Build(f, nil, policy.Options{Clock: opts.Clock, Observer: h.metrics, Upstream: opts.Upstream})
	if err != nil {
		return nil, err
	}
	h.rt, h.version, h.file = rt, versionOf(data, f), digest(data)
	h.mw, err = httpcore.New(rt.Chain, h.gateConfig(rt))
	if err == nil && opts.OnBuild != nil {
		err = opts.OnBuild(rt)
	}
	if err != nil {
		rt.Close()
		return nil, err
	}
	h.metrics.Gates(h.Chain)
	return h, nil
}

func (h *Host) gateConfig(rt *policy.Runtime) httpcore.Config {
	return httpcore.Config{Rules: rt.Rules, Jitter: h.opts.Jitter, AccessLog: h.opts.AccessLog, ProblemDetails: h.opts.ProblemDetails, Propagate: h.opts.Upstream}
}

// Reloads reports whether the policy can be reloaded (it came from a
// file, not from Options.ConfigData).
func (h *Host) Reloads() bool { return h.opts.ConfigData == nil }

// Middleware returns the middleware deciding with the policy serving now
// (Reload updates it in place).
func (h *Host) Middleware() *httpcore.Middleware { return h.mw }

// Metrics returns the metrics every decision is counted in.
func (h *Host) Metrics() *metrics.Metrics { return h.metrics }

// Chain returns the chain serving now.
func (h *Host) Chain() *sluice.Chain { return h.mw.Chain() }

// TokenFile returns the file of the generated admin token (Options.TokenFile;
// "" when the token was given), which Close removes.
func (h *Host) TokenFile() string { return h.opts.TokenFile }

// Close stops the live page's readings and releases the runtime serving
// now (its Redis client, its leases).
func (h *Host) Close() {
	h.hist.close()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rt.Close()
	if h.opts.TokenFile != "" {
		os.Remove(h.opts.TokenFile)
	}
}

// Reload re-reads the policy file. A valid file replaces the policy without
// dropping requests in flight and keeps the state of unchanged gates; an
// invalid one (or one Options.Check refuses) is refused, logged, and the
// old policy keeps serving. It returns whether the policy changed. It is
// the operator's reload (SIGHUP): the files the policy reads (a password
// file, TLS files) are read again even when the policy file is unchanged,
// and a file refused before is tried again (what refused it may have been
// Redis, or a file since fixed).
func (h *Host) Reload() (bool, error) { return h.reload(true) }

// versionOf is the version of a policy: its file's digest, with that of
// the files it read when it reads any.
func versionOf(data []byte, f *policy.File) string {
	if in := f.Inputs(); in != "" {
		return digest(append(append([]byte(nil), data...), in...))
	}
	return digest(data)
}

// reload is Reload; the watcher's (not explicit) skips an unchanged file
// and stays quiet about one it refused before.
func (h *Host) reload(explicit bool) (bool, error) {
	if !h.Reloads() {
		return false, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data, err := yamlfile.ReadFile(h.opts.Config)
	if err != nil {
		h.log.Error("policy reload refused: cannot read file; the old policy keeps serving", "file", h.opts.Config, "err", err)
		return false, err
	}
	fileV := digest(data)
	if fileV == h.file && !(explicit && h.rt.File.ReadsFiles()) {
		return false, nil
	}
	if fileV == h.refused && !explicit {
		return false, h.why // refused and logged before: stay quiet
	}
	f, err := policy.Parse(h.opts.Config, data)
	if err == nil {
		v := versionOf(data, f)
		if v == h.version {
			return false, nil // the file and what it reads are as serving
		}
		if err = h.apply(f, v, fileV); err == nil {
			return true, nil
		}
	}
	h.refused, h.why = fileV, err
	h.log.Error("policy reload refused; the old policy keeps serving", "file", h.opts.Config, "err", err)
	return false, err
}

// apply checks f and, if nothing refuses it, starts it in place of the
// policy serving (v: its version with what it reads; fileV: the file's).
// Everything that may refuse the new policy runs before the old one is
// touched: only then do the gates it replaces stop. REQUIRES: h.mu held.
func (h *Host) apply(f *policy.File, v, fileV string) error {
	if len(f.Gates) == 0 && len(h.rt.File.Gates) > 0 {
		return errors.New("the new policy has no gates: every limit would be off at once (to pass all traffic, set the gates' mode to off)")
	}
	if h.opts.Check != nil {
		if err := h.opts.Check(f); err != nil {
			return err
		}
	}
	rt, err := policy.Prepare(f, h.rt, policy.Options{Clock: h.opts.Clock, Observer: h.metrics, Upstream: h.opts.Upstream})
	if err != nil {
		return err
	}
	h.keepModeOverrides(rt)
	err = h.gateConfig(rt).Check()
	if err == nil && h.opts.OnBuild != nil {
		err = h.opts.OnBuild(rt)
	}
	if err != nil {
		rt.Discard(h.rt)
		return err
	}
	rt.Start(h.rt)
	if err := h.mw.Update(rt.Chain, h.gateConfig(rt)); err != nil { // checked above: cannot happen
		h.log.Error("policy reload: the checked configuration refused; the old chain serves on", "file", h.opts.Config, "err", err)
	}
	h.rt, h.version, h.file, h.refused = rt, v, fileV, ""
	h.log.Info("policy reloaded", "file", h.opts.Config, "version", fileV, "gates", len(f.Gates))
	return nil
}

// keepModeOverrides carries a gate's run-time mode (set on the admin API)
// into the new chain when the file did not change that gate's mode: an
// operator's kill switch must survive an unrelated edit.
func (h *Host) keepModeOverrides(rt *policy.Runtime) {
	declared := map[string]sluice.Mode{}
	for _, g := range h.rt.File.Gates {
		declared[g.Name] = g.Mode
	}
	old := h.mw.Chain()
	for _, g := range rt.File.Gates {
		was, ok := declared[g.Name]
		cur, live := old.Mode(g.Name)
		if !ok || !live || was != g.Mode || cur == g.Mode {
			continue
		}
		rt.Chain.SetMode(g.Name, cur)
		h.log.Warn("run-time mode override kept across reload", "gate", g.Name, "mode", cur.String(), "file_mode", g.Mode.String())
	}
}

// Watch checks the policy file on every tick until ctx is done and reloads
// it when it was replaced: a new file renamed over the path (what editors,
// `mv`, configuration management and Kubernetes' ConfigMap volumes do),
// once two checks read the same content. A file changed in place is not
// loaded: a writer may pause anywhere (a truncated file can be a valid
// policy with fewer gates), so the watcher cannot know it is complete. It
// logs that the change waits for SIGHUP, once per change.
func (h *Host) Watch(ctx context.Context, ticks <-chan time.Time) {
	// loaded is the file serving; tried the last file the watcher tried and
	// the policy refused. An in-place write to either is not loaded: a file
	// refused once and then edited in place may be read half-written as
	// well (it loaded a truncated but valid policy, one gate of two).
	w := watcher{h: h}
	w.loaded, _ = os.Stat(h.opts.Config)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			w.tick()
		}
	}
}

// watcher is Watch's state between ticks.
type watcher struct {
	h             *Host
	loaded, tried os.FileInfo
	pending, told string
	unreadable    string // the error last logged of a file that could not be read ("": none)
}

func same(fi, of os.FileInfo) bool { return of != nil && os.SameFile(fi, of) }

func unchanged(fi, of os.FileInfo) bool {
	return same(fi, of) && fi.ModTime().Equal(of.ModTime()) && fi.Size() == of.Size()
}

// tick checks the file once.
func (w *watcher) tick() {
	h := w.h
	fi, err := os.Stat(h.opts.Config)
	if err != nil {
		w.gone(err)
		return
	}
	// A file no longer at the path is forgotten: its inode number may be
	// reused by the next file renamed there, which would then look like
	// it, written in place.
	if !same(fi, w.loaded) {
		w.loaded = nil
	}
	if !same(fi, w.tried) {
		w.tried = nil
	}
	if unchanged(fi, w.loaded) || unchanged(fi, w.tried) {
		return
	}
	data, err := yamlfile.ReadFile(h.opts.Config)
	if err != nil {
		w.gone(err)
		return
	}
	w.unreadable = ""
	v := digest(data)
	switch {
	case v == h.fileVersion():
		w.loaded = fi // what serves (reloaded on SIGHUP, say)
	case same(fi, w.loaded) || same(fi, w.tried):
		w.inPlace(fi, v)
	case v != w.pending:
		w.pending = v // loaded once two checks read the same content
	default:
		if _, err := h.reload(false); err == nil {
			w.loaded, w.tried = fi, nil
		} else {
			w.tried = fi
		}
	}
}

// gone logs, once per error, a policy file the watcher cannot read (it
// was deleted, a symbolic link swapped to nothing; one it finds unchanged
// it does not read again): the policy serving goes on, and nothing said
// so.
func (w *watcher) gone(err error) {
	if err.Error() == w.unreadable {
		return
	}
	w.unreadable = err.Error()
	w.h.log.Warn("policy file unreadable; the policy loaded keeps serving", "policy", w.h.opts.Config, "err", err)
}

// inPlace answers a file written in place (content v): not loaded, and
// said so once per content.
func (w *watcher) inPlace(fi os.FileInfo, v string) {
	if v == w.h.refusedVersion() {
		w.told = v // a reload (SIGHUP) refused this content and said why
	}
	if v != w.told {
		w.told = v
		w.h.log.Warn("policy file changed in place: not reloaded, since a file written in place may be read half-written; replace it atomically (write a new file, rename it over) or send SIGHUP", "file", w.h.opts.Config)
	}
	if same(fi, w.tried) {
		w.tried = fi // told once for this content
	}
}

// refusedVersion returns the digest of the file content last refused.
func (h *Host) refusedVersion() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused
}

// fileVersion returns the digest of the policy file serving now.
func (h *Host) fileVersion() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.file
}

// Version returns the digest of the policy file serving now: the same in
// every process that serves the same file. It covers nothing of the files
// the policy reads (a password, a TLS key): a version is shown without
// authentication (/v1/live, the logs), and a digest of a secret with a
// known file beside it would let a weak secret be guessed offline. A
// rotated secret reloads the policy (the change is told apart in-process)
// with the same version.
func (h *Host) Version() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.file
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// AdminToken returns token, or for an empty one on a loopback admin
// address a generated token written to a new file only this user can read
// (mode 0600; the file's path and the token's Fingerprint are logged, the
// token never is), and that file (for Options.TokenFile; "" when token was
// given). It refuses an empty token on any other address: the admin API
// can switch gates off. who prefixes errors ("proxy", "serve"). A given
// token is taken without surrounding white space (a newline read from a
// file with it: a client's Authorization value loses it, so the token
// could never match), and refused if white space or a control character
// is left inside it, which no Bearer credential can carry.
func AdminToken(who, addr, token string, log *slog.Logger) (string, string, error) {
	token = strings.TrimSpace(token)
	if token != "" {
		if i := strings.IndexFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
			return "", "", fmt.Errorf("%s: the admin token has white space or a control character at byte %d: no client can send it as a bearer token", who, i)
		}
		return token, "", nil
	}
	if !Loopback(addr) {
		return "", "", fmt.Errorf("%s: the admin listener on %s is not on loopback and has no admin token: it can switch gates off, so set one (--admin-token, or $SLUICE_ADMIN_TOKEN)", who, addr)
	}
	token, file, err := generateToken()
	if err != nil {
		return "", "", fmt.Errorf("%s: writing the generated admin token: %v", who, err)
	}
	log.Info("admin token generated (the file is readable by this user only, and removed when the server closes)", "file", file, "fingerprint", Fingerprint(token))
	return token, file, nil
}

// Fingerprint names a secret in logs without showing it: "sha256:" and
// the first 8 hex digits of its SHA-256, enough to tell two tokens apart,
// far too little to guess one.
func Fingerprint(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(s[:4])
}

// Loopback reports whether addr (host:port) listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// generateToken makes a random admin token and writes it to a new file
// only this user can read.
func generateToken() (token, file string, err error) {
	var b [16]byte
	rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	f, err := os.CreateTemp("", "sluice-admin-token-*") // mode 0600
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	if _, err := f.WriteString(token + "\n"); err != nil {
		return "", "", err
	}
	return token, f.Name(), nil
}
