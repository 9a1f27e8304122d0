package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/serve"
)

// serveCmd is `sluice serve`: the decision service for proxies that stay
// on the data path. Its listeners are flags of their own (--http, --admin)
// so that more protocols can join as more flags.
func serveCmd() *cobra.Command {
	var opts serve.Options
	cmd := &cobra.Command{
		Use:   "serve --config FILE [--http ADDR] [--admin ADDR]",
		Short: "Decide for nginx auth_request and Envoy ext_authz (HTTP) under the policy in FILE (rate gates only)",
		Long: "sluice serve answers decision requests: at " + serve.DecidePath + " an nginx auth_request subrequest (the original\n" +
			"method and URI in X-Original-Method and X-Original-URI), under " + serve.ExtAuthzPrefix + "/ an Envoy ext_authz HTTP check\n" +
			"(path_prefix " + serve.ExtAuthzPrefix + "). It answers 200 to admit, or 429/503 with Retry-After and the RateLimit\n" +
			"fields, 400 for malformed headers. The proxy never says when the work ends, so a policy with\n" +
			"concurrency, queue or completion-driven gates is refused (sluice check --serve lists them).\n" +
			"The admin listener and hot reload are those of sluice proxy.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.AdminToken == "" {
				opts.AdminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
			}
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			s, err := serve.New(opts)
			if err != nil {
				printPolicyErrors(cmd, err)
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			reloadOnHUP(ctx, s.Reload, opts.Logger, opts.Config)
			return s.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Config, "config", "", "policy file (YAML); reloaded on SIGHUP and on change")
	f.StringVar(&opts.HTTP, "http", "127.0.0.1:8081", "decision endpoints' listen address ("+serve.DecidePath+", "+serve.ExtAuthzPrefix+"/)")
	f.StringVar(&opts.Admin, "admin", "127.0.0.1:9901", "admin listen address (/metrics, /healthz, /v1/gates)")
	f.StringVar(&opts.AdminToken, "admin-token", "", "bearer token for /v1/gates (default $SLUICE_ADMIN_TOKEN; else, on a loopback --admin only, generated into a file whose path is logged)")
	f.StringVar(&opts.Decision.MethodHeader, "method-header", "X-Original-Method", "header with the original method at "+serve.DecidePath)
	f.StringVar(&opts.Decision.URIHeader, "uri-header", "X-Original-URI", "header with the original request URI at "+serve.DecidePath)
	cmd.MarkFlagRequired("config")
	return cmd
}

// reloadOnHUP reloads the policy on every SIGHUP until ctx is done.
func reloadOnHUP(ctx context.Context, reload func() (bool, error), log *slog.Logger, file string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if changed, err := reload(); err == nil && !changed {
					log.Info("SIGHUP: policy file unchanged", "file", file)
				}
			}
		}
	}()
}
