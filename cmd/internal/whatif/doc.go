// Package whatif replays recorded traffic through a candidate policy on a
// virtual clock, with the same gates `sluice proxy` runs, and reports what
// the candidate would have admitted and refused, by gate, class and tenant
// and over time, beside the decisions recorded or those of the current
// policy on the same traffic; `sluice whatif` is its command line.
//
//	recs, stats, err := whatif.ReadFile("access.log", whatif.ReadOptions{})
//	rep, err := whatif.Replay(recs, whatif.Options{Candidate: cand, Current: cur})
//	rep.WriteTable(os.Stdout)
//
// # What is replayed, and how faithfully
//
// Each request arrives at its recorded time (an admitted request's access
// line is written when it ends: it arrived its duration earlier) with its
// method, path, client address and tenant. The candidate's routes give its
// class, operation and cost; a route that reads its cost from a request
// header cannot (logs do not carry it), and Options.RecordedCost charges
// the cost sluice's log recorded instead. Admitted requests go to a
// modeled upstream: the fewest first-come first-served workers that could
// have served the recording, each request served for its recorded duration
// less the wait for a worker that implies (a request the recording refused
// has no duration, and takes the median of its operation's). So a
// candidate that admits more makes the upstream slower, one that admits
// less relieves it, and concurrency and adaptive gates see the latencies
// that follow. Rate gates replay exactly, as long as nothing after them
// refunds differently; deadline-driven gates see one deadline for every
// request (Options.Deadline), since logs carry no deadline header; and the
// rejections a sampled log left out (suppressed=N) cannot be replayed at
// all: record with --access-log-rejects -1 for a faithful replay.
//
// # Formats
//
// sluice's own access log (JSON lines or the text form), nginx's combined
// log format (with $request_time appended, durations too; timestamps of
// whole seconds are spread evenly over their second), and Envoy's JSON
// access log (start_time, method, path, response_code, duration, the
// downstream address and, if logged, a tenant field).
package whatif
