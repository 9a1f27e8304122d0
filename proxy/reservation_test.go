package proxy

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Over real HTTP, a class below its in-flight reserve is never refused,
// with or without a wait queue, while a flood of another class borrows
// what it may: critical reserves 10 of 20 units and sends from 5
// connections (at most 10 units held: each connection's next request can
// reach the gate before the proxy released its last); sheddable floods
// from 40 connections. (Before, the in-flight
// reservation lent idle reserved units and refused the owner until the
// borrowed work drained: 34 refusals while it held 3 to 9 of its 10.)
func TestReservationOwnerNeverRefusedBelowItsReserve(t *testing.T) {
	for _, queue := range []string{"", ", queue: {max_wait: 100ms, classes: [critical, default, sheddable]}"} {
		t.Run(fmt.Sprintf("queue=%v", queue != ""), func(t *testing.T) {
			_, base := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout, default: 500ms}
routes:
  - {match: {path: /c}, class: critical}
  - {match: {path: /s}, class: sheddable}
gates:
  - {name: units, kind: reservation, inflight: 20, recovery: 5, revocation: 1s, shares: {critical: {reserve: 10}, sheddable: {reserve: 5}}`+queue+`}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(20 * time.Millisecond)
				io.WriteString(w, "ok")
			}))
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer hc.CloseIdleConnections()
			var critOK, critRefused, shedOK, shedRefused atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			loop := func(path string, ok, refused *atomic.Int64, pause time.Duration) {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := hc.Get(base + path)
					if err != nil {
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						ok.Add(1)
					} else {
						refused.Add(1)
					}
					time.Sleep(pause)
				}
			}
			for i := 0; i < 40; i++ {
				wg.Add(1)
				go loop("/s", &shedOK, &shedRefused, 2*time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // sheddable borrows first
			for i := 0; i < 5; i++ {
				wg.Add(1)
				go loop("/c", &critOK, &critRefused, time.Duration(i)*3*time.Millisecond)
			}
			time.Sleep(1500 * time.Millisecond)
			close(stop)
			wg.Wait()
			t.Logf("critical %d answered, %d refused; sheddable %d answered, %d refused", critOK.Load(), critRefused.Load(), shedOK.Load(), shedRefused.Load())
			if critRefused.Load() != 0 || critOK.Load() == 0 {
				t.Fatalf("critical, at most 10 in flight of a reserve of 10: %d refused, %d answered", critRefused.Load(), critOK.Load())
			}
			if shedOK.Load() == 0 || shedRefused.Load() == 0 {
				t.Fatalf("the flood: %d answered, %d refused: it did not press on the reservation", shedOK.Load(), shedRefused.Load())
			}
		})
	}
}
