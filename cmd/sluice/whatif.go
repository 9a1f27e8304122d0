package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/cmd/internal/whatif"
	"github.com/sluice-go/sluice/policy"
)

// whatifFlags are the flags of sluice whatif.
type whatifFlags struct {
	logPath, format, tenantField string
	current, jsonPath, plotBase  string
	interval, deadline           time.Duration
	tenants, workers             int
	recordedCost, follow         bool
}

func whatifCmd() *cobra.Command {
	var fl whatifFlags
	cmd := &cobra.Command{
		Use:   "whatif --log FILE CANDIDATE.yaml",
		Short: "Replay recorded traffic through a candidate policy and report what it would refuse",
		Long: "sluice whatif replays a recorded log (sluice's access log, nginx's combined format or Envoy's JSON\n" +
			"access log) through the candidate policy's gates on a virtual clock, and reports what it would have\n" +
			"admitted and refused, by gate, class and tenant and over time, beside the decisions the log records\n" +
			"(or, with --current, those of the current policy on the same traffic). Record every decision with\n" +
			"sluice's --access-log --access-log-rejects -1 for a faithful replay; docs/whatif.md says what replays\n" +
			"exactly and what does not.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return fl.run(cmd, args[0]) },
	}
	cmd.Flags().StringVar(&fl.logPath, "log", "", "the recorded log (required)")
	cmd.Flags().StringVar(&fl.format, "format", "", "the log's format: sluice, combined or envoy (default: from its first line)")
	cmd.Flags().StringVar(&fl.tenantField, "tenant-field", "", "envoy: the JSON field that holds the tenant (e.g. x_api_key)")
	cmd.Flags().StringVar(&fl.current, "current", "", "the policy in force, replayed as the baseline (default: the decisions the log records)")
	cmd.Flags().DurationVar(&fl.interval, "interval", time.Minute, "the timeline's step")
	cmd.Flags().IntVar(&fl.tenants, "tenants", 10, "how many of the tenants refused most to list")
	cmd.Flags().BoolVar(&fl.recordedCost, "recorded-cost", false, "charge the cost sluice's log records instead of the routes' (for costs read from a request header)")
	cmd.Flags().IntVar(&fl.workers, "workers", 0, "the modeled upstream's workers, first come first served, each serving one request at a time for its recorded duration less its wait for a worker (0: the fewest that could have served the log; -1: no model, every admitted request takes its recorded duration)")
	cmd.Flags().DurationVar(&fl.deadline, "deadline", 0, "the deadline header every request carried (logs do not carry it), read as the policy reads it: cut to identity.deadline.max, ignored without identity.deadline.header; 0: the policy's default")
	cmd.Flags().BoolVar(&fl.follow, "follow", false, "the gates whose decisions depend on timing (all but the rate kinds) decide as the log records, and no upstream is modeled: checks that the policy that recorded the log replays it (its rate gates, request for request); sluice's log only")
	cmd.Flags().StringVar(&fl.jsonPath, "json", "", "also write the report as JSON to this file")
	cmd.Flags().StringVar(&fl.plotBase, "plot", "", "write the refusals over time to this path plus .png and .svg")
	return cmd
}

func (fl *whatifFlags) run(cmd *cobra.Command, candidate string) error {
	if fl.logPath == "" {
		return errors.New("--log: the recorded log is required")
	}
	switch {
	case fl.interval <= 0:
		return fmt.Errorf("--interval %v: want a positive duration", fl.interval)
	case fl.tenants < 1:
		return fmt.Errorf("--tenants %d: want at least 1", fl.tenants)
	case fl.workers < -1:
		return fmt.Errorf("--workers %d: want at least 1, or 0 (from the log) or -1 (no upstream model)", fl.workers)
	case fl.deadline < 0:
		return fmt.Errorf("--deadline %v: want 0 (the policy's default) or more", fl.deadline)
	}
	cand, err := policy.Load(candidate)
	if err != nil {
		return err
	}
	var cur *policy.File
	if fl.current != "" {
		if cur, err = policy.Load(fl.current); err != nil {
			return err
		}
	}
	start := time.Now()
	recs, st, err := whatif.ReadFile(fl.logPath, whatif.ReadOptions{Format: whatif.Format(fl.format), TenantField: fl.tenantField})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d lines, %d requests (%s format) read in %v\n", fl.logPath, st.Lines, st.Requests, st.Format, time.Since(start).Round(time.Millisecond))
	if fl.follow && st.Format != whatif.FormatSluice {
		return fmt.Errorf("--follow: a %s log does not say which gate refused a request; --follow needs sluice's", st.Format)
	}
	if st.Malformed > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d lines skipped as malformed; the first: %s\n", fl.logPath, st.Malformed, st.FirstMalformed)
	}
	rep, err := whatif.Replay(recs, whatif.Options{Candidate: cand, Current: cur, Interval: fl.interval, Tenants: fl.tenants, RecordedCost: fl.recordedCost,
		Workers: fl.workers, Deadline: fl.deadline, Follow: fl.follow})
	if err != nil {
		return err
	}
	if st.Suppressed > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the log sampled its rejections: %d more were counted without a line and are not replayed (record with --access-log-rejects -1)", st.Suppressed))
	}
	if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	if fl.jsonPath != "" {
		if err := rep.WriteJSON(fl.jsonPath); err != nil {
			return err
		}
	}
	if fl.plotBase != "" {
		if err := rep.WritePlot(fl.plotBase+".png", fl.plotBase+".svg"); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s.png and %s.svg\n", fl.plotBase, fl.plotBase)
	}
	return nil
}
