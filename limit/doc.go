// Package limit holds sluice's rate and concurrency algorithms as exact step
// functions over explicit state and an explicit monotonic now, with no
// clock, lock or allocation of their own: stores (in memory, Redis) make a
// step atomic for a key, and tests replay them on a time grid.
//
// Every algorithm keeps integer or fixed-point state, so very low rates
// (1/h), very high rates (1e9/s) and days of idle time give exact results;
// a now earlier than the state's last update (a clock step back, or a
// timestamp read before another goroutine's update) never creates capacity;
// a refund never lifts state above fresh.
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(200), 400)
//	var s limit.TokenBucketState          // zero value: full bucket
//	r := tb.Take(&s, now, 1)              // r.Status, r.Remaining, r.RetryAfter
//
// Algorithms: TokenBucket, GCRA, FixedWindow, SlidingLog, SlidingWindow
// (counter), LeakyBucket (a bounded paced queue) and Concurrency.
package limit
