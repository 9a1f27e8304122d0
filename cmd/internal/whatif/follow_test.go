package whatif

import (
	"strings"
	"testing"
	"time"
)

// With Follow, a timing gate decides as the recording says, at the time
// the recording says, and the rate gate before it gets its tokens back
// then: the policy that recorded a log replays it request for request.
// Vectors by hand, tenant a at 1 token/s with a burst of 1, behind a
// concurrency gate of one slot with a wait queue:
//   - 0 s: the slot gate turns r0 away at once; its token comes back.
//   - 0.1 s: r1 is admitted on that token.
//   - 0.2 s: r2 finds the bucket empty (0.1 tokens).
//   - 1.3 s: the slot gate turns r3 away after 500 ms in its queue; its
//     token (taken at 1.3 s, 1.2 tokens there) comes back at 1.8 s.
//   - 1.5 s: r4 finds 0.2 + 0 tokens: refused at the rate.
//   - 1.9 s: r5 is admitted on the token r3 gave back at 1.8 s.
//
// Without Follow the slot gate, with nothing in flight, admits r0 and r3,
// and the replay disagrees.
func TestFollowReplaysTheRecording(t *testing.T) {
	f := mustPolicy(t, "p.yaml", `version: 1
service: follow-test
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: tenant-rate, kind: token_bucket, rate: 1/s, burst: 1}
  - {name: slots, kind: concurrency, scope: service, limit: 1, queue: {max_wait: 500ms}}
`)
	s := func(sec float64) int64 { return int64(sec * float64(time.Second)) }
	recs := []Record{
		{At: s(0), Decision: Rejected, Gate: "slots", Reason: "concurrency", Duration: -1},
		{At: s(0.1), Decision: Admitted, Duration: 10 * time.Millisecond},
		{At: s(0.2), Decision: Rejected, Gate: "tenant-rate", Reason: "policy_rate", Duration: -1},
		{At: s(1.3), Decision: Rejected, Gate: "slots", Reason: "queue", Duration: -1, Wait: 500 * time.Millisecond},
		{At: s(1.5), Decision: Rejected, Gate: "tenant-rate", Reason: "policy_rate", Duration: -1},
		{At: s(1.9), Decision: Admitted, Duration: 10 * time.Millisecond},
	}
	for i := range recs {
		recs[i].Method, recs[i].Path, recs[i].Tenant = "GET", "/", "a"
		recs[i].At += s(100)
	}
	rep, err := Replay(recs, Options{Candidate: f, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Agreement.Same != int64(len(recs)) {
		var out strings.Builder
		rep.WriteTable(&out)
		t.Fatalf("following, %d of %d the same:\n%s", rep.Agreement.Same, len(recs), out.String())
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "decided as the recording says (--follow): slots") {
		t.Errorf("notes: %q", rep.Notes)
	}
	rep, err = Replay(recs, Options{Candidate: f})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Agreement.Same == int64(len(recs)) {
		t.Error("without following, the slot gate with nothing in flight agreed with the recording")
	}
}

// reasonNamed inverts Reason.String.
func TestReasonNamed(t *testing.T) {
	for _, s := range []string{"policy_rate", "concurrency", "deadline", "overload", "queue"} {
		if got := reasonNamed(s).String(); got != s {
			t.Errorf("%s: %s", s, got)
		}
	}
	if reasonNamed("bogus").String() != "" {
		t.Error("an unknown reason is not ReasonNone")
	}
}

// A request the recording turned away after a wait at a followed gate
// never reached the gates after it: a rate gate behind the queue keeps its
// token for the next request. And a followed gate in shadow mode turns
// nothing away, waited or not (the rate gate then spends its token on r0,
// and turns r1 away).
func TestFollowTurnsAwayAtTheGate(t *testing.T) {
	text := func(mode string) string {
		return `version: 1
service: follow-test
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: slots, kind: concurrency, scope: service, limit: 1, queue: {max_wait: 500ms}` + mode + `}
  - {name: tenant-rate, kind: token_bucket, rate: 1/s, burst: 1}
`
	}
	recs := []Record{
		{At: 0, Decision: Rejected, Gate: "slots", Reason: "queue", Duration: -1, Wait: 500 * time.Millisecond},
		{At: int64(100 * time.Millisecond), Decision: Admitted, Duration: 10 * time.Millisecond},
	}
	for i := range recs {
		recs[i].Method, recs[i].Path, recs[i].Tenant = "GET", "/", "a"
		recs[i].At += int64(time.Hour)
	}
	rep, err := Replay(recs, Options{Candidate: mustPolicy(t, "p.yaml", text("")), Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Agreement.Same != 2 {
		t.Errorf("enforced: %d of 2 the same; candidate %+v", rep.Agreement.Same, rep.Candidate.Gates)
	}
	rep, err = Replay(recs, Options{Candidate: mustPolicy(t, "p.yaml", text(", mode: shadow")), Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rep.Candidate.Gates {
		if g.Gate == "slots" {
			t.Errorf("a shadow gate turned %d away", g.Rejected)
		}
	}
}
