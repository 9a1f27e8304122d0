package proxy

import "sync"

// copyBufferSize is the size of the buffers the reverse proxy copies
// response bodies through: httputil.ReverseProxy's own default.
const copyBufferSize = 32 << 10

// copyBuffers is the reverse proxy's httputil.BufferPool. Without one,
// ReverseProxy allocates a fresh 32 KiB buffer for every response it
// copies: most of the bytes a proxied request allocated (45 KB of 46 KB in
// BenchmarkThroughProxy). Safe for concurrent use.
type copyBuffers struct{ p sync.Pool }

// Get returns a buffer of copyBufferSize bytes.
func (c *copyBuffers) Get() []byte {
	if b, ok := c.p.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, copyBufferSize)
}

// Put gives a buffer back; one of another size (never handed out here) is
// dropped.
func (c *copyBuffers) Put(b []byte) {
	if cap(b) != copyBufferSize {
		return
	}
	b = b[:copyBufferSize]
	c.p.Put(&b)
}

// get is Get for the proxy's own code, which hands the same pointer back
// to put: Put must box a new one (an allocation a body copied).
func (c *copyBuffers) get() *[]byte {
	if b, ok := c.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, copyBufferSize)
	return &b
}

// put gives back a buffer from get.
func (c *copyBuffers) put(b *[]byte) { c.p.Put(b) }
