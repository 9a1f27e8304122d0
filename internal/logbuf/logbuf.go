// Package logbuf is a log destination for tests: a buffer that servers'
// goroutines may write to while the test reads what was logged so far.
//
//	var b logbuf.Buffer
//	log := slog.New(slog.NewTextHandler(&b, nil))
//	... strings.Contains(b.String(), "request cut")
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use. The zero value is
// empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
