// Package limit holds sluice's rate and concurrency algorithms as exact step
// functions over explicit state and an explicit monotonic now, with no
// clock, lock or allocation of their own: stores (in memory, Redis) make a
// step atomic for a key, and tests replay them on a time grid.
//
// Every algorithm keeps integer or fixed-point state, so very low rates
// (1/h), very high rates (1e9/s) and days of idle time give exact results;
// a now earlier than the state's last update never creates capacity: up to
// ClockTolerance (5 s) it is a stale reading (a timestamp read before
// another goroutine's update) and counts at the state's own instant;
// further back it is a step of the clock, and the state moves to the new
// time with what it holds, so nobody is locked out for the step's length.
// A refund never lifts state above fresh, and state kept across a lowered
// limit reads as at most empty.
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(200), 400)
//	var s limit.TokenBucketState          // zero value: full bucket
//	r := tb.Take(&s, now, 1)              // r.Status, r.Remaining, r.RetryAfter
//
// Algorithms: TokenBucket, GCRA, FixedWindow, SlidingLog, SlidingWindow
// (counter), LeakyBucket (a bounded paced queue) and Concurrency.
package limit
