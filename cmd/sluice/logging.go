package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/grpclog"

	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/policy"
)

// Log flags, on the root command for every subcommand.
const (
	flagLogFormat = "log-format"
	flagLogLevel  = "log-level"
)

func addLogFlags(cmd *cobra.Command) {
	cmd.PersistentFlags().String(flagLogFormat, "text", "log format: text (logfmt key=value) or json (one object a line)")
	cmd.PersistentFlags().String(flagLogLevel, "info", "least severe log level written: debug, info, warn or error")
}

// newLogger is the one slog handler of a command, writing to w in format
// at level and up. It becomes slog's default (and so the standard log
// package's) and gRPC's logger, so that every line a command writes is in
// the one format.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil || strings.ContainsAny(level, "+-") {
		return nil, fmt.Errorf("--%s %q: want debug, info, warn or error", flagLogLevel, level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--%s %q: want text or json", flagLogFormat, format)
	}
	log := slog.New(h)
	slog.SetDefault(log)
	// gRPC reads its logger without a lock: set it once, before any gRPC
	// work (a process runs one command; tests run many).
	grpcLogOnce.Do(func() { grpclog.SetLoggerV2(grpcLogger{log: log, lim: &lineLimiter{}}) })
	return log, nil
}

var grpcLogOnce sync.Once

// logger returns the command's logger, to its standard error, as the root
// command's log flags say.
func logger(cmd *cobra.Command) (*slog.Logger, error) {
	format, _ := cmd.Flags().GetString(flagLogFormat)
	level, _ := cmd.Flags().GetString(flagLogLevel)
	return newLogger(cmd.ErrOrStderr(), format, level)
}

// grpcLogger is grpclog.LoggerV2 over slog. gRPC's info lines (connection
// state changes, many) go at debug level; its warnings and errors, which a
// client can make it write for every bad call (3.3 MB from 20,000 calls in
// 0.7 s), at most grpcLinesPerSecond a second, the rest counted on the
// next line as suppressed=N.
type grpcLogger struct {
	log *slog.Logger
	lim *lineLimiter
}

var _ grpclog.LoggerV2 = grpcLogger{}

// grpcLinesPerSecond bounds gRPC's warning and error lines.
const grpcLinesPerSecond = 10

// lineLimiter lets through at most grpcLinesPerSecond lines a second and
// counts the rest.
type lineLimiter struct {
	mu         sync.Mutex
	second     int64
	n          int
	suppressed int
}

// allow reports whether a line may be written now and how many were
// suppressed since the last one written.
func (l *lineLimiter) allow() (bool, int) {
	now := time.Now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now != l.second {
		l.second, l.n = now, 0
	}
	if l.n >= grpcLinesPerSecond {
		l.suppressed++
		return false, 0
	}
	l.n++
	s := l.suppressed
	l.suppressed = 0
	return true, s
}

// limited writes msg at level, within the limiter.
func (g grpcLogger) limited(level slog.Level, msg string) {
	ok, suppressed := g.lim.allow()
	if !ok {
		return
	}
	if suppressed > 0 {
		g.log.Log(context.Background(), level, msg, "from", "grpc", "suppressed", suppressed)
		return
	}
	g.log.Log(context.Background(), level, msg, "from", "grpc")
}

func (g grpcLogger) Info(args ...any)   { g.log.Debug(fmt.Sprint(args...), "from", "grpc") }
func (g grpcLogger) Infoln(args ...any) { g.log.Debug(fmt.Sprint(args...), "from", "grpc") }
func (g grpcLogger) Infof(format string, args ...any) {
	g.log.Debug(fmt.Sprintf(format, args...), "from", "grpc")
}
func (g grpcLogger) Warning(args ...any)   { g.limited(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.limited(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.limited(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.limited(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.limited(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.limited(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs at error level; gRPC exits after a fatal line, as its own
// logger does.
func (g grpcLogger) Fatal(args ...any)   { g.log.Error(fmt.Sprint(args...), "from", "grpc") }
func (g grpcLogger) Fatalln(args ...any) { g.log.Error(fmt.Sprint(args...), "from", "grpc") }
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.log.Error(fmt.Sprintf(format, args...), "from", "grpc")
}

// V reports whether verbosity level l is on: gRPC's verbose lines go at
// debug level, and only when the handler takes debug.
func (g grpcLogger) V(l int) bool { return g.log.Enabled(context.Background(), slog.LevelDebug) }

// serverFlags are the flags `sluice proxy` and `sluice serve` share for
// their HTTP side: the access log, the rejection body, the drain.
type serverFlags struct {
	accessLog      bool
	rejects        int
	problemDetails bool
	drainGrace     time.Duration
	drainDelay     time.Duration
}

func (f *serverFlags) add(fl *pflag.FlagSet, what string) {
	fl.BoolVar(&f.accessLog, "access-log", false, "log one line per "+what+" (info level; rejections sampled, see --access-log-rejects)")
	fl.IntVar(&f.rejects, "access-log-rejects", 1, "access log: rejection lines per reason per second (the rest are counted on the next line as suppressed=N); -1: every one")
	fl.BoolVar(&f.problemDetails, "problem-details", false, "answer rejections with RFC 9457 problem details (application/problem+json) instead of the JSON envelope; status and headers unchanged")
	fl.DurationVar(&f.drainGrace, "drain-grace", 10*time.Second, "on SIGTERM: /readyz turns 503 at once, then requests in flight get this long before their connections are closed (the HTTP requests cut are logged and counted in sluice_drain_requests_cut_total, the gRPC calls cut logged with their number)")
	fl.DurationVar(&f.drainDelay, "drain-delay", 0, "on SIGTERM: keep accepting and serving this long (/readyz answering 503) before the listener stops and --drain-grace begins, so that load balancers stop sending first; on Kubernetes more than the readiness probe's period times its failure threshold; 0: stop at once")
}

// accessLogger returns the access log the flags ask for, or nil.
func (f *serverFlags) accessLogger(log *slog.Logger) (*httpgate.AccessLog, error) {
	if f.drainGrace <= 0 {
		return nil, fmt.Errorf("--drain-grace %v: want > 0", f.drainGrace)
	}
	if f.drainDelay < 0 {
		return nil, fmt.Errorf("--drain-delay %v: want 0 or more", f.drainDelay)
	}
	if !f.accessLog {
		return nil, nil
	}
	if f.rejects < -1 || f.rejects == 0 {
		return nil, fmt.Errorf("--access-log-rejects %d: want at least 1, or -1 for every rejection", f.rejects)
	}
	return &httpgate.AccessLog{Logger: log, RejectsPerSecond: f.rejects}, nil
}

// logStartErrors logs how a server ended: a clean stop (err nil) as one
// line; a policy that does not load as each of its errors (file: line:
// field) on a record of its own, so that the log stays in one format, and
// one line saying the server did not start; any other error as the line
// it stopped with. It tells cobra not to print the error again.
func logStartErrors(cmd *cobra.Command, log *slog.Logger, err error) error {
	if err == nil {
		log.Info(cmd.CommandPath() + " stopped")
		return nil
	}
	var es policy.Errors
	if errors.As(err, &es) {
		for _, e := range es {
			log.Error("policy error", "error", e.Error())
		}
		log.Error(cmd.CommandPath()+" did not start: the policy has errors", "errors", len(es))
	} else {
		log.Error(cmd.CommandPath()+" stopped", "err", err)
	}
	cmd.SilenceErrors = true
	return err
}
