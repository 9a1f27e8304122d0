// Package memory is sluice's in-process state store: it makes each step of a
// package limit algorithm atomic per key, for one key (Bucket, Single) or for
// millions (Keyed over a sharded, capped table), with no allocation on the
// decision path of an existing key.
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
//	perTenant := memory.NewKeyed(tb, memory.Options{MaxKeys: 1 << 20})
//	res, h, _ := perTenant.Take(ctx, tenant, clock.Now(), cost, 0)
//
//	one, _ := memory.NewBucket(limit.PerSecond(100), 500, nil) // nil: clock.System
//	if one.Allow(1) { ... }
//
// At its key cap a Keyed drops fresh keys first, then evicts keys seen only
// once before established ones, so a flood of distinct keys never locks new
// tenants out; see Keyed.
package memory
