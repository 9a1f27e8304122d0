package proxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

func TestCopyBuffers(t *testing.T) {
	var c copyBuffers
	b := c.Get()
	if len(b) != copyBufferSize {
		t.Fatalf("Get: %d bytes", len(b))
	}
	c.Put(b[:10]) // a re-sliced buffer comes back whole
	if b2 := c.Get(); len(b2) != copyBufferSize {
		t.Fatalf("after Put of a short slice: %d bytes", len(b2))
	}
	c.Put(make([]byte, 100)) // not ours: dropped
	if b3 := c.Get(); len(b3) != copyBufferSize {
		t.Fatalf("after Put of a foreign buffer: %d bytes", len(b3))
	}
}

// Concurrent responses of many sizes through the proxy's pooled copy
// buffers arrive byte for byte: no buffer is shared by two copies.
func TestPooledCopiesKeepBodiesApart(t *testing.T) {
	bodies := make([][]byte, 16)
	for i := range bodies {
		bodies[i] = make([]byte, 1+i*9000) // up to ~135 KB: several buffers' worth
		rand.Read(bodies[i])
	}
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1000}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			i, _ := strconv.Atoi(r.URL.Query().Get("i"))
			w.Write(bodies[i])
		}))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 40 {
				i := (w*7 + k) % len(bodies)
				resp, err := http.Get(base + "/b?i=" + strconv.Itoa(i))
				if err != nil {
					t.Error(err)
					return
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !bytes.Equal(got, bodies[i]) {
					t.Errorf("body %d: %d bytes, not the upstream's %d", i, len(got), len(bodies[i]))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// get and put share the pool with Get and Put, and a buffer put back
// whole is handed out again without an allocation.
func TestCopyBuffersByPointer(t *testing.T) {
	var c copyBuffers
	b := c.get()
	if len(*b) != copyBufferSize {
		t.Fatalf("get: %d bytes", len(*b))
	}
	c.put(b)
	if g := c.Get(); len(g) != copyBufferSize {
		t.Fatalf("Get after put: %d bytes", len(g))
	}
	c.Put(make([]byte, copyBufferSize))
	if g := c.get(); len(*g) != copyBufferSize {
		t.Fatalf("get after Put: %d bytes", len(*g))
	}
	if raceEnabled {
		return // the race detector makes sync.Pool drop items at random
	}
	c.put(c.get())
	if n := testing.AllocsPerRun(100, func() { c.put(c.get()) }); n != 0 {
		t.Errorf("get and put: %.1f allocations, want 0", n)
	}
}
