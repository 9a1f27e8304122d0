package client

// Budget is a retry budget, a token bucket of retries: every request
// deposits Ratio tokens, every retry spends one, and the bucket holds at
// most Burst (it starts full). Over any stretch of time, then, retries are
// at most Ratio × requests + Burst, whatever fails: under a 100% failure
// rate a client sends at most (1 + Ratio) attempts per request in the long
// run, instead of the attempt limit's multiple. This is the shape of
// Finagle's RetryBudget and of gRPC's retryThrottling (gRFC A6), whose
// token_ratio plays the part of Ratio.
//
// A Budget is not safe for concurrent use; a Retrier guards its own.
type Budget struct {
	ratio, burst float64
	tokens       float64
}

// NewBudget returns a full budget of ratio retries per request that saves
// at most burst. ratio and burst are clamped to ≥ 0.
func NewBudget(ratio, burst float64) *Budget {
	ratio, burst = max(ratio, 0), max(burst, 0)
	return &Budget{ratio: ratio, burst: burst, tokens: burst}
}

// Deposit credits one request.
func (b *Budget) Deposit() { b.tokens = min(b.tokens+b.ratio, b.burst) }

// Withdraw spends a retry's token and reports whether there was one; false
// means the budget is exhausted and the retry must not be sent.
func (b *Budget) Withdraw() bool {
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Tokens returns the retries the budget would allow now.
func (b *Budget) Tokens() float64 { return b.tokens }
