// Package client is the client half of admission control: retries that
// dampen an overload instead of amplifying it. Its Transport (an
// http.RoundTripper; grpcgate has the gRPC interceptors over the same
// Retrier) retries only what may be retried, waits full-jitter exponential
// backoff or the server's Retry-After jittered upward, stops at the
// request's deadline, its attempt limit, a per-client retry budget and a
// cap on any one wait (20 s: a longer Retry-After returns the refusal),
// sheds locally with Google SRE's adaptive throttle when the server refuses
// most requests, and paces to the quota a server advertises in its
// RateLimit fields before the quota runs out.
//
//	r, _ := client.New(client.Options{Observer: client.NewMetrics(client.MetricsOptions{Client: "routes-api"})})
//	hc := &http.Client{Transport: &client.Transport{Retrier: r}, Timeout: 2 * time.Second}
//	resp, err := hc.Get("https://routes.example/v1/routes/42")
//
// Vocabulary. A request is one logical call by the application; an attempt
// is one try of it on the wire (offered load: every retry is counted). A
// refusal is a 429 or 503 (RESOURCE_EXHAUSTED or UNAVAILABLE) from an
// admission gate; it is retryable unless the server says otherwise
// (sluice's envelope: "retryable": false; gRPC: a negative pushback), and
// without effect when the server says the work never began ("effect_possible":
// false), which makes it safe to retry even for a method that is not
// idempotent. A replay-safe request may be retried after an attempt that may
// have had an effect: an idempotent method (RFC 9110 §9.2.2) or an
// Idempotency-Key, with a body that can be sent again.
//
// The algorithms are small types with an explicit now and an explicit
// random draw, so that they are exact on a fake clock and reusable by the
// simulator: Backoff and Floor (the waits), Budget (retries ≤ Ratio ×
// requests + Burst), Throttle (p = max(0, (requests − K·accepts) /
// (requests + 1))) and Pacer (the quota's remaining units spread over the
// time to its reset). A Retrier holds one of each per client under a lock.
package client
