// Package fair decides who gets a service's capacity when there is not
// enough for everyone: class reservations that lend what their owner leaves
// idle, priority-cohort shedding that cuts an exact lowest fraction of the
// load, and the weighted max-min allocation both are judged by.
//
//	res, _ := fair.NewReservation("mercury-units", fair.ReservationOptions{
//		Capacity: 4000, // work units/s the downstream serves
//		Recovery: 200,  // units/s no class may use
//		Classes: []fair.ClassShare{
//			{Class: "critical", Reserve: 2400},
//			{Class: "sheddable", Reserve: 1400},
//		},
//	})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, res, pool)
//
// What each piece guarantees:
//   - Reservation: a class always finds its reserved rate; what it leaves
//     idle flows to a shared pool any borrowing class may spend; the pool
//     holds at most Revocation's worth of capacity, so when the owner comes
//     back the borrowed work still to be served is bounded by that time.
//     Admitted work is never cancelled. Admitted work in any window of T is
//     at most (Capacity − Recovery)·T plus the buckets' depth.
//   - Slots: the same division of concurrent work units; a class is always
//     admitted up to its reserve: idle reserved units are lent only up to
//     the recovery headroom and only to requests due within the revocation
//     time, and an owner that comes back takes them back at once from the
//     headroom, which is free again within that time.
//   - Cohort: a shed fraction f from any controller turns into a cut of the
//     lowest f of recent arrivals ranked by (class tier, tenant cohort),
//     with a rotation that spreads the cut over the tenants.
//   - MaxMin: weighted water-filling, the allocation a fair queue
//     converges to (the fair queue itself is in package queue).
package fair
