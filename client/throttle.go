package client

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Throttle is client-side adaptive throttling (Google, "Site Reliability
// Engineering", ch. 21, "Handling Overload"): the client counts, over a
// sliding window, the requests it was asked to send and those the server
// accepted, and rejects a new request locally, before it costs the server
// anything, with probability
//
//	p = max(0, (requests − K·accepts) / (requests + 1)).
//
// While the server accepts most requests p is 0; once it rejects more than
// a 1 − 1/K share, the client sheds the excess itself, and it still sends
// about K requests per accept, so it notices recovery. Requests rejected
// locally count as requests, as in the book.
//
// A request that is sent is counted when its outcome is known (Done), not
// when it goes out: counted on sending, the requests in flight would weigh
// as refused until they are answered, and a client that sends a burst of
// concurrent requests with an empty window would count tens of requests
// and no accept, and refuse most of its own burst to a healthy server.
// Counting on completion is also how the common implementations of the
// book's throttle count (go-kratos' and go-zero's "sre" breakers).
//
// The window is split into buckets that expire whole. Until the window
// holds minRequests requests the throttle rejects nothing: one refusal of a
// new client's first request would otherwise shed half of what follows.
// A Throttle is not safe for concurrent use; a Retrier guards its own.
type Throttle struct {
	k       float64
	min     int64
	width   time.Duration // of a bucket
	buckets []bucket
}

type bucket struct {
	start             int64 // bucket index (time / width) it counts for
	requests, accepts int64
}

// NewThrottle returns a throttle with multiplier k (≥ 1 for any effect:
// K = 2 in the book) over a sliding window of the given length split into
// n buckets (n ≥ 1, window ≥ n ns), that rejects nothing while the window
// holds fewer than minRequests requests.
func NewThrottle(k float64, window time.Duration, n int, minRequests int64) *Throttle {
	n = max(n, 1)
	width := max(window/time.Duration(n), 1)
	return &Throttle{k: k, min: minRequests, width: width, buckets: make([]bucket, n)}
}

// at returns the bucket for now, clearing it if it counted an older span.
func (t *Throttle) at(now clock.Instant) *bucket {
	idx := int64(now) / int64(t.width)
	if now < 0 && int64(now)%int64(t.width) != 0 {
		idx-- // floor division, so bucket spans are the same on both sides of 0
	}
	b := &t.buckets[uint64(idx)%uint64(len(t.buckets))]
	if b.start != idx {
		*b = bucket{start: idx}
	}
	return b
}

// counts returns the requests and accepts inside the window ending at now.
func (t *Throttle) counts(now clock.Instant) (requests, accepts int64) {
	cur := t.at(now).start
	for i := range t.buckets {
		b := &t.buckets[i]
		if b.start <= cur && b.start > cur-int64(len(t.buckets)) {
			requests += b.requests
			accepts += b.accepts
		}
	}
	return requests, accepts
}

// probability returns the local rejection probability at now: the formula
// on the window's counts, 0 below minRequests.
func (t *Throttle) probability(now clock.Instant) float64 {
	r, a := t.counts(now)
	if r < t.min {
		return 0
	}
	return probability(r, a, t.k)
}

// probability is the formula of Throttle: max(0, (requests − k·accepts) /
// (requests + 1)).
func probability(requests, accepts int64, k float64) float64 {
	p := (float64(requests) - k*float64(accepts)) / (float64(requests) + 1)
	return max(p, 0)
}

// Allow reports whether to send a request at now: false with the
// throttle's probability (u is a uniform draw in [0, 1)), a local
// rejection, which counts as a request at once. A request it lets go is
// counted by Done, once its outcome is known.
func (t *Throttle) Allow(now clock.Instant, u float64) bool {
	if u < t.probability(now) {
		t.at(now).requests++
		return false
	}
	return true
}

// Done counts, at now, a request that Allow let go and whose outcome is
// known: accepted (any answer that is not a refusal for load or quota) or
// not (refused, or no answer came).
func (t *Throttle) Done(now clock.Instant, accepted bool) {
	b := t.at(now)
	b.requests++
	if accepted {
		b.accepts++
	}
}
