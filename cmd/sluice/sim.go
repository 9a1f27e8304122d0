package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/cmd/internal/sim"
	"github.com/sluice-go/sluice/examples"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// simFlags are the flags of sluice sim.
type simFlags struct {
	config, scenario, jsonPath, plotBase string
	retry                                string
	seed                                 uint64
	noPolicy                             bool
	incidents, quick                     bool
	only                                 []string
}

func simCmd() *cobra.Command {
	var fl simFlags
	cmd := &cobra.Command{
		Use:   "sim [--scenario NAME|FILE] [--config POLICY]",
		Short: "Simulate a service under overload on a virtual clock, with and without the policy's real gates",
		Long: "sluice sim runs a deterministic discrete-event model of a service (workers, a queue, service times)\n" +
			"and its clients (open-loop arrivals, timeouts, retries) once without admission and once through the\n" +
			"policy's gates, on a virtual clock. Built-in scenarios: " + strings.Join(sim.Builtins(), ", ") + ".\n" +
			"The same seed gives the same output, bit for bit.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return fl.run(cmd) },
	}
	cmd.Flags().StringVar(&fl.scenario, "scenario", "mercury", "a built-in scenario ("+strings.Join(sim.Builtins(), ", ")+") or a scenario file")
	cmd.Flags().StringVar(&fl.config, "config", "", "policy file for the run with admission (default: the scenario's policy)")
	cmd.Flags().BoolVar(&fl.noPolicy, "no-policy", false, "only the run without admission")
	cmd.Flags().Uint64Var(&fl.seed, "seed", 0, "random seed (default: the scenario's)")
	cmd.Flags().StringVar(&fl.retry, "retry", "", "the callers' retry policy, naive or sluice (package client), instead of the scenario's client.retry")
	cmd.Flags().StringVar(&fl.jsonPath, "json", "", "also write the rows as JSON to this file (-: stdout, instead of the table)")
	cmd.Flags().StringVar(&fl.plotBase, "plot", "sluice-sim", "write the goodput plot to this path plus .png and .svg (empty: no plot)")
	cmd.Flags().BoolVar(&fl.incidents, "incidents", false, "run the incident library (hour-long overloads, capacity steps, a slow dependency, a retry storm, a diurnal ramp, a flash crowd, a partial fleet) through the policy and print a pass/fail table; exit status 1 if one fails")
	cmd.Flags().BoolVar(&fl.quick, "quick", false, "with --incidents: each long phase 4 minutes instead of up to an hour (what CI runs)")
	cmd.Flags().StringSliceVar(&fl.only, "only", nil, "with --incidents: only these incidents (by name)")
	return cmd
}

func (fl *simFlags) run(cmd *cobra.Command) error {
	if fl.incidents {
		return fl.runIncidents(cmd)
	}
	if fl.quick || len(fl.only) > 0 {
		return errors.New("--quick and --only go with --incidents")
	}
	s, err := fl.loadScenario(cmd)
	if err != nil {
		return err
	}
	if fl.noPolicy && fl.config != "" {
		return errors.New("--no-policy and --config: choose one")
	}
	switch fl.retry {
	case "":
	case sim.RetryNaive, sim.RetrySluice:
		s.Client.Retry = fl.retry
	default:
		return fmt.Errorf("--retry %q: want naive or sluice", fl.retry)
	}
	// Output paths are checked before a possibly long simulation.
	jsonFile, err := fl.outputs()
	if err != nil {
		return err
	}
	if jsonFile != nil {
		defer jsonFile.Close() // after an error; the success path closes it and checks
	}
	opts := sim.Options{Seed: fl.seed}
	if !fl.noPolicy {
		if opts.Policy, err = simPolicy(fl.config, s.Policy); err != nil {
			if fl.config == "" && s.Policy != "" {
				return fmt.Errorf("%s: policy: %w", fl.scenario, err)
			}
			return err
		}
	}
	rep, err := sim.Simulate(s, opts)
	if err != nil {
		if n := printPolicyErrors(cmd, err); n > 0 {
			return fmt.Errorf("%d error(s)", n)
		}
		return err
	}
	if err := fl.write(cmd, rep, jsonFile); err != nil {
		return err
	}
	return savePlot(cmd, rep, fl.plotBase)
}

// loadScenario returns the built-in scenario or the scenario file named by
// --scenario; a policy path in a file is relative to the file.
func (fl *simFlags) loadScenario(cmd *cobra.Command) (sim.Scenario, error) {
	if s, ok := sim.Builtin(fl.scenario); ok {
		return s, nil
	}
	if !strings.HasSuffix(fl.scenario, ".yaml") && !strings.HasSuffix(fl.scenario, ".yml") {
		if _, err := os.Stat(fl.scenario); err != nil {
			return sim.Scenario{}, fmt.Errorf("--scenario %q: no such built-in scenario (%s) or file", fl.scenario, strings.Join(sim.Builtins(), ", "))
		}
	}
	s, err := sim.LoadScenario(fl.scenario)
	if err != nil {
		if n := printPolicyErrors(cmd, err); n > 0 {
			return s, fmt.Errorf("%s: %d error(s)", fl.scenario, n)
		}
		return s, err
	}
	if _, _, example := examples.ByName(s.Policy); !example && s.Policy != "" && !filepath.IsAbs(s.Policy) {
		s.Policy = filepath.Join(filepath.Dir(fl.scenario), s.Policy)
	}
	return s, nil
}

// outputs checks that the plot can be written and opens the JSON file,
// if any (nil for none or stdout).
func (fl *simFlags) outputs() (*os.File, error) {
	if st, err := os.Stat(fl.plotBase); fl.plotBase != "" && (strings.HasSuffix(fl.plotBase, "/") || err == nil && st.IsDir()) {
		fl.plotBase = filepath.Join(fl.plotBase, "sluice-sim")
	}
	if fl.plotBase != "" {
		for _, ext := range []string{".png", ".svg"} {
			f, err := os.OpenFile(fl.plotBase+ext, os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				return nil, fmt.Errorf("%w (--plot \"\" for no plot)", err)
			}
			f.Close()
		}
	}
	if fl.jsonPath == "" || fl.jsonPath == "-" {
		return nil, nil
	}
	return os.Create(fl.jsonPath)
}

// write prints the table and writes the JSON rows where asked.
func (fl *simFlags) write(cmd *cobra.Command, rep *sim.Report, jsonFile *os.File) error {
	switch {
	case fl.jsonPath == "-":
		return rep.WriteJSON(cmd.OutOrStdout())
	case jsonFile != nil:
		rep.WriteTable(cmd.OutOrStdout())
		if err := rep.WriteJSON(jsonFile); err != nil {
			return err
		}
		if err := jsonFile.Close(); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "rows written to %s\n", fl.jsonPath)
	default:
		rep.WriteTable(cmd.OutOrStdout())
	}
	return nil
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
	data, err := yamlfile.ReadFile(config)
	if err != nil {
		return nil, err
	}
	return &sim.Policy{Name: config, Data: data}, nil
}

// chosenIncidents are the incidents --only names, or all of them.
func (fl *simFlags) chosenIncidents() ([]sim.Incident, error) {
	var list []sim.Incident
	for _, in := range sim.Incidents() {
		if len(fl.only) == 0 || slices.Contains(fl.only, in.Name) {
			list = append(list, in)
		}
	}
	for _, name := range fl.only {
		if !slices.ContainsFunc(list, func(in sim.Incident) bool { return in.Name == name }) {
			return nil, fmt.Errorf("--only %q: no such incident", name)
		}
	}
	return list, nil
}

// runEach runs the incidents through pol, each on a core of its own.
func (fl *simFlags) runEach(list []sim.Incident, pol *sim.Policy) ([]sim.IncidentResult, error) {
	results := make([]sim.IncidentResult, len(list))
	errs := make([]error, len(list))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, in := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i], errs[i] = sim.RunIncident(in, pol, fl.quick, fl.seed)
		}()
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// runIncidents runs the incident library through --config (default: the
// routes-api example, the demo's policy), each incident on its own core,
// and prints the table.
func (fl *simFlags) runIncidents(cmd *cobra.Command) error {
	if cmd.Flags().Changed("scenario") || fl.noPolicy || fl.retry != "" {
		return errors.New("--incidents runs its own scenarios through a policy: no --scenario, --no-policy or --retry")
	}
	pol, err := simPolicy(fl.config, "routes-api")
	if err != nil {
		return err
	}
	list, err := fl.chosenIncidents()
	if err != nil {
		return err
	}
	var jsonFile *os.File
	if fl.jsonPath != "" && fl.jsonPath != "-" {
		if jsonFile, err = os.Create(fl.jsonPath); err != nil {
			return err
		}
		defer jsonFile.Close()
	}
	results, err := fl.runEach(list, pol)
	if err != nil {
		if n := printPolicyErrors(cmd, err); n > 0 {
			return fmt.Errorf("%d error(s)", n)
		}
		return err
	}
	out := cmd.OutOrStdout()
	if fl.jsonPath == "-" {
		return json.NewEncoder(out).Encode(results)
	}
	sim.WriteIncidents(out, pol.Name, fl.quick, results)
	if jsonFile != nil {
		if err := json.NewEncoder(jsonFile).Encode(results); err != nil {
			return err
		}
		if err := jsonFile.Close(); err != nil {
			return err
		}
	}
	failed := 0
	for _, r := range results {
		if !r.Pass {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d incidents failed", failed, len(results))
	}
	return nil
}
