package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/client"
)

// A client of a service that refuses its first request with 503 and
// Retry-After: 1: the Transport waits at least the second the server asked
// for (here a Sleep that only reports it) and retries once.
func ExampleTransport() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"reason":"overload","retryable":true,"effect_possible":false}}`)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	r, _ := client.New(client.Options{
		Sleep: func(_ context.Context, d time.Duration) error {
			fmt.Println("waited at least 1s:", d >= time.Second)
			return nil
		},
	})
	hc := &http.Client{Transport: &client.Transport{Retrier: r}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(srv.URL + "/v1/routes/42")
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "after", calls.Load(), "attempts")
	// Output:
	// waited at least 1s: true
	// 200 ok after 2 attempts
}
