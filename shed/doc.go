// Package shed holds sluice's in-process protection controllers: gates that
// measure this process and keep it in its safe region when it is in
// trouble, whoever is asking, answering 503 with reason overload.
// NewUtilization sheds by tier, lowest first, at a fraction driven by a slow
// controller on worker utilization; Ladder moves the service through
// NORMAL, DEGRADE, SHED and RECOVER with hysteresis, a minimum dwell and a
// staged recovery ramp. (The fleet-wide usage shedder keeps its count in a
// store, so it lives with the other store gates in package gate.)
//
//	cfg := shed.ControllerConfig{} // good 0.7, bad 0.8, delay 28 s, 120 s to shed all
//	u, _ := shed.NewUtilization("worker-utilization", cfg, shed.UtilizationOptions{
//		Workers: 64, Tiers: []string{"sandbox", "sheddable", "default", "critical"}})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, u)
package shed
