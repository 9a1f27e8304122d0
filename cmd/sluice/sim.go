package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/cmd/internal/sim"
	"github.com/sluice-go/sluice/examples"
	"github.com/sluice-go/sluice/policy"
)

func simCmd() *cobra.Command {
	var config, scenario, jsonPath, plotBase string
	var seed uint64
	var noPolicy bool
	cmd := &cobra.Command{
		Use:   "sim [--scenario NAME|FILE] [--config POLICY]",
		Short: "Simulate a service under overload on a virtual clock, with and without the policy's real gates",
		Long: "sluice sim runs a deterministic discrete-event model of a service (workers, a queue, service times)\n" +
			"and its clients (open-loop arrivals, timeouts, retries) once without admission and once through the\n" +
			"policy's gates, on a virtual clock. Built-in scenarios: " + strings.Join(sim.Builtins(), ", ") + ".\n" +
			"The same seed gives the same output, bit for bit.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, ok := sim.Builtin(scenario)
			if !ok {
				if !strings.HasSuffix(scenario, ".yaml") && !strings.HasSuffix(scenario, ".yml") {
					if _, err := os.Stat(scenario); err != nil {
						return fmt.Errorf("--scenario %q: no such built-in scenario (%s) or file", scenario, strings.Join(sim.Builtins(), ", "))
					}
				}
				var err error
				if s, err = sim.LoadScenario(scenario); err != nil {
					if n := printPolicyErrors(cmd, err); n > 0 {
						return fmt.Errorf("%s: %d error(s)", scenario, n)
					}
					return err
				}
				// A policy path in a scenario file is relative to the file.
				if _, _, example := examples.ByName(s.Policy); !example && s.Policy != "" && !filepath.IsAbs(s.Policy) {
					s.Policy = filepath.Join(filepath.Dir(scenario), s.Policy)
				}
			}
			if noPolicy && config != "" {
				return errors.New("--no-policy and --config: choose one")
			}
			// Output paths are checked before a possibly long simulation.
			var jsonFile *os.File
			if jsonPath != "" && jsonPath != "-" {
				f, err := os.Create(jsonPath)
				if err != nil {
					return err
				}
				defer f.Close() // after an error; the success path closes it and checks
				jsonFile = f
			}
			if st, err := os.Stat(plotBase); plotBase != "" && (strings.HasSuffix(plotBase, "/") || err == nil && st.IsDir()) {
				plotBase = filepath.Join(plotBase, "sluice-sim")
			}
			if plotBase != "" {
				for _, ext := range []string{".png", ".svg"} {
					f, err := os.OpenFile(plotBase+ext, os.O_WRONLY|os.O_CREATE, 0o644)
					if err != nil {
						return fmt.Errorf("%w (--plot \"\" for no plot)", err)
					}
					f.Close()
				}
			}
			var opts sim.Options
			if !noPolicy {
				pol, err := simPolicy(config, s.Policy)
				if err != nil {
					if config == "" && s.Policy != "" {
						return fmt.Errorf("%s: policy: %w", scenario, err)
					}
					return err
				}
				opts.Policy = pol
			}
			opts.Seed = seed
			rep, err := sim.Simulate(s, opts)
			if err != nil {
				var pe policy.Errors
				if errors.As(err, &pe) {
					printPolicyErrors(cmd, err)
					return fmt.Errorf("%d error(s)", len(pe))
				}
				return err
			}
			if jsonPath != "-" {
				rep.WriteTable(cmd.OutOrStdout())
			}
			switch {
			case jsonPath == "-":
				if err := rep.WriteJSON(cmd.OutOrStdout()); err != nil {
					return err
				}
			case jsonFile != nil:
				if err := rep.WriteJSON(jsonFile); err != nil {
					return err
				}
				if err := jsonFile.Close(); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "rows written to %s\n", jsonPath)
			}
			return savePlot(cmd, rep, plotBase)
		},
	}
	cmd.Flags().StringVar(&scenario, "scenario", "mercury", "a built-in scenario ("+strings.Join(sim.Builtins(), ", ")+") or a scenario file")
	cmd.Flags().StringVar(&config, "config", "", "policy file for the run with admission (default: the scenario's policy)")
	cmd.Flags().BoolVar(&noPolicy, "no-policy", false, "only the run without admission")
	cmd.Flags().Uint64Var(&seed, "seed", 0, "random seed (default: the scenario's)")
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the rows as JSON to this file (-: stdout, instead of the table)")
	cmd.Flags().StringVar(&plotBase, "plot", "sluice-sim", "write the goodput plot to this path plus .png and .svg (empty: no plot)")
	return cmd
}

// simPolicy reads --config, or else the scenario's policy: a built-in
// example name or a file.
func simPolicy(config, scenarioPolicy string) (*sim.Policy, error) {
	if config == "" && scenarioPolicy != "" {
		if data, file, ok := examples.ByName(scenarioPolicy); ok {
			return &sim.Policy{Name: "examples/" + file, Data: data}, nil
		}
		config = scenarioPolicy
	}
	if config == "" {
		return nil, errors.New("no policy: give --config FILE (or --no-policy)")
	}
	data, err := os.ReadFile(config)
	if err != nil {
		return nil, err
	}
	return &sim.Policy{Name: config, Data: data}, nil
}
