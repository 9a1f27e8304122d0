package sim

import (
	"bytes"
	"math"
	"testing"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
)

// examples/lease-fleet.yaml's leased gate.
const (
	fleetRate     = 1000.0 // the leased rate, req/s
	fleetBurst    = 100.0  // the local buckets' depth, req (100 ms of a grant; at most the rate's in all)
	fleetLease    = 5.0    // lease time, s
	fleetRefresh  = 1.25   // refresh interval, s (a quarter of the lease)
	fleetHeadroom = 0.1    // what a lease gate asks for above its demand, as a share
)

// The lease-fleet series: four gateway processes in front of one API share
// examples/lease-fleet.yaml's leased 1,000 req/s, offered three times that
// at 4:3:2:1; process-4 stops from 20 s to 40 s and comes back below its
// fair share. In each phase's steady state every process admits its
// max-min share of the rate over what the processes ask for (their demand
// plus the gates' 10% headroom): all four 250 req/s, then the three left
// 333 each, then process-4 all it is sent and the others the rest, evenly.
// While every sending process wants more than its share the fleet admits
// 1,000 ± 1% every second; with one below its share, the headroom it asks
// for and does not use stays idle (a few % of the rate).
func TestLeaseFleetScenario(t *testing.T) {
	s := builtin(t, "lease-fleet")
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "lease-fleet")})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Processes != 4 {
		t.Fatalf("report of %d processes, want 4", rep.Processes)
	}
	rows := rep.Runs[1].Steps
	for _, r := range rows {
		// The grants never sum above the rate, so no second admits more
		// than the rate plus the buckets' burst.
		if r.Admitted > fleetRate+fleetBurst {
			t.Errorf("t=%vs: %.0f req/s admitted, above the rate and burst %.0f", r.T, r.Admitted, fleetRate+fleetBurst)
		}
		checkProcesses(t, rep.Runs[1].Name, r)
	}
	// The new budget's allocator learns for one lease time; one refresh
	// later every process holds its share.
	steady := int(math.Ceil(fleetLease + fleetRefresh))
	checkLeasePhase(t, rows, "all four at 4:3:2:1", steady, 20, true)
	checkLeasePhase(t, rows, "process-4 stopped", 20+steady, 40, true)
	checkLeasePhase(t, rows, "process-4 below its fair share", 40+2, 60, false)

	// process-4's share goes to the others once its lease has lapsed and
	// they have refreshed: within a lease time and a refresh.
	took := -1
	for i := 20; i < 40 && took < 0; i++ {
		if min(rows[i].Processes[0].Admitted, rows[i].Processes[1].Admitted, rows[i].Processes[2].Admitted) >= 0.97*fleetRate/3 {
			took = i
		}
	}
	t.Logf("the others hold process-4's share from t=%ds", took)
	if took < 0 || float64(took-20) > fleetLease+fleetRefresh {
		t.Errorf("the others took process-4's share at row %d, want within %vs of 20 s", took, fleetLease+fleetRefresh)
	}
	// Back below its fair share, process-4 admits what it is sent within
	// two refreshes (the others shrink to make room at their next one).
	if p := rows[40+2].Processes[3]; p.Admitted < 0.95*p.Attempts {
		t.Errorf("process-4 at 42 s: %.0f of %.0f req/s admitted", p.Admitted, p.Attempts)
	}
	// Without admission the processes only spread the load: they admit
	// everything they are sent.
	for _, r := range rep.Runs[0].Steps {
		for _, p := range r.Processes {
			if p.Admitted != p.Attempts {
				t.Fatalf("no admission, t=%vs: %s admitted %.0f of %.0f", r.T, p.Name, p.Admitted, p.Attempts)
			}
		}
	}
}

// checkLeasePhase checks one phase's steady rows [from, to) of the
// lease-fleet series: each process's mean admitted within 3% of its
// max-min share of the rate over what the processes ask for (none for a
// process that is sent nothing, all it is sent for one below its share)
// and, when tight, every row's total within [0.97, 1.01] × the rate and
// each process's within 5% of its mean; else the mean total within
// [0.95, 1.01] × the rate.
func checkLeasePhase(t *testing.T, rows []Row, what string, from, to int, tight bool) {
	t.Helper()
	n := float64(to - from)
	var offered, attempts, admitted [4]float64
	total := 0.0
	for _, r := range rows[from:to] {
		for i, p := range r.Processes {
			offered[i] += p.Offered / n
			attempts[i] += p.Attempts / n
			admitted[i] += p.Admitted / n
		}
		total += r.Admitted / n
		if tight && (r.Admitted < 0.97*fleetRate || r.Admitted > 1.01*fleetRate) {
			t.Errorf("%s: t=%vs: %.0f req/s admitted, want [0.97, 1.01] × %.0f", what, r.T, r.Admitted, fleetRate)
		}
	}
	t.Logf("%s: %.1f req/s admitted in all", what, total)
	if !tight && (total < 0.95*fleetRate || total > 1.01*fleetRate) {
		t.Errorf("%s: %.1f req/s admitted in all, want [0.95, 1.01] × %.0f", what, total, fleetRate)
	}
	hs := make([]lease.Holding, len(attempts))
	for i := range hs {
		hs[i] = lease.Holding{Client: processName(i), Wants: int64(attempts[i] * (1 + fleetHeadroom))}
	}
	shares := leasealloc.FairShares(int64(fleetRate), hs, 0)
	for i, h := range hs {
		want := min(float64(shares[h.Client]), attempts[i])
		t.Logf("%s: %s offered %.1f, attempts %.1f, admitted %.1f req/s (max-min share %.1f)", what, h.Client, offered[i], attempts[i], admitted[i], want)
		if math.Abs(admitted[i]-want) > 0.03*max(want, 10) {
			t.Errorf("%s: %s admitted %.1f req/s, want %.1f ± 3%%", what, h.Client, admitted[i], want)
		}
	}
	if !tight {
		return
	}
	for _, r := range rows[from:to] {
		for i, p := range r.Processes {
			if admitted[i] > 0 && math.Abs(p.Admitted-admitted[i]) > 0.05*admitted[i] {
				t.Errorf("%s: t=%vs: %s admitted %.0f req/s, its mean %.0f", what, r.T, p.Name, p.Admitted, admitted[i])
			}
		}
	}
}

// Several processes replay bit for bit: the processes' draws come from
// their own seeded stream and the allocator runs on the virtual clock.
func TestLeaseFleetDeterministic(t *testing.T) {
	s := builtin(t, "lease-fleet")
	opts := Options{Policy: examplePolicy(t, "lease-fleet"), Seed: 5}
	a, b := reportJSON(t, s, opts), reportJSON(t, s, opts)
	if !bytes.Equal(a, b) {
		t.Fatal("two runs of lease-fleet with seed 5 differ")
	}
	opts.Seed = 6
	if c := reportJSON(t, s, opts); bytes.Equal(a, c) {
		t.Fatal("seeds 5 and 6 gave identical reports")
	}
}
