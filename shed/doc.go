// Package shed holds sluice's protection gates: they keep the service in its
// safe region when it is in trouble, whoever is asking, and answer 503 with
// reason overload. FleetUsage reserves a share of a fleet-wide concurrency
// budget for critical classes; Utilization sheds by tier, lowest first, at
// a fraction driven by a slow controller on worker utilization; Ladder
// moves the service through NORMAL, DEGRADE, SHED and RECOVER with
// hysteresis, a minimum dwell and a staged recovery ramp.
//
//	ctrl, _ := shed.NewController(shed.ControllerConfig{}) // good 0.7, bad 0.8, delay 28 s, 120 s to shed all
//	u, _ := shed.NewUtilization("worker-utilization", ctrl, shed.UtilizationOptions{
//		Workers: 64, Tiers: []string{"sandbox", "sheddable", "default", "critical"}})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, u)
package shed
