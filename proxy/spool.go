package proxy

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
)

// A spool holds the bytes of one request body or one response while the
// proxy decouples the client's speed from the upstream's: in memory up to
// a few kilobytes, then in an unlinked temporary file, within budgets the
// whole proxy shares. A slow client then costs the proxy buffer space, not
// an admitted slot of the upstream. The first few kilobytes of each spool
// are not charged to the budgets (as the servers' own read buffers are
// not): small bodies and answers go through when the budgets are spent.

// errSpoolFull: a shared budget is spent; errSpoolCap: the spool's own
// cap is reached (a request body too large, a response to stream).
var (
	errSpoolFull = errors.New("proxy: buffer budget spent")
	errSpoolCap  = errors.New("proxy: buffer cap reached")
)

// budget is bytes shared by every spool of the proxy.
type budget struct {
	left atomic.Int64
}

func newBudget(n int64) *budget {
	b := &budget{}
	b.left.Store(n)
	return b
}

// take reserves n bytes, or reports that they are not there.
func (b *budget) take(n int64) bool {
	if b.left.Add(-n) >= 0 {
		return true
	}
	b.left.Add(n)
	return false
}

func (b *budget) give(n int64) { b.left.Add(n) }

// spoolLimits are what one spool may hold and where.
type spoolLimits struct {
	memory  int     // bytes held in memory before the file
	free    int     // of those, bytes not charged to memPool
	max     int64   // the most the spool may hold in all
	memPool *budget // memory shared by every spool
	disk    *budget // file bytes shared by every spool
	dir     string  // where temporary files go ("": the system's)
}

// spool is written once, then read once; it is not safe for concurrent use.
type spool struct {
	lim     spoolLimits
	mem     []byte
	memHeld int64 // bytes of memPool reserved
	file    *os.File
	fileLen int64 // bytes of disk reserved and written
	size    int64
	rd      int64 // read offset into the file
	mrd     int   // read offset into mem
}

func newSpool(lim spoolLimits) *spool { return &spool{lim: lim} }

// Write appends p, or fails having written nothing of p when p would
// pass the cap (errSpoolCap) or a budget (errSpoolFull).
func (s *spool) Write(p []byte) (int, error) {
	if s.size+int64(len(p)) > s.lim.max {
		return 0, errSpoolCap
	}
	if s.file == nil && len(s.mem)+len(p) <= s.lim.memory {
		charge := int64(max(0, len(s.mem)+len(p)-s.lim.free) - max(0, len(s.mem)-s.lim.free))
		if s.lim.memPool.take(charge) {
			s.memHeld += charge
			s.mem = append(s.mem, p...)
			s.size += int64(len(p))
			return len(p), nil
		}
	}
	if !s.lim.disk.take(int64(len(p))) {
		return 0, errSpoolFull
	}
	if s.file == nil {
		f, err := os.CreateTemp(s.lim.dir, "sluice-buffer-*")
		if err != nil {
			s.lim.disk.give(int64(len(p)))
			return 0, errSpoolFull
		}
		os.Remove(f.Name()) // unlinked: the space goes when the file closes
		s.file = f
	}
	n, err := s.file.Write(p)
	s.fileLen += int64(len(p))
	s.size += int64(n)
	if err != nil {
		return n, errSpoolFull
	}
	return n, nil
}

// Read reads back what was written, memory first.
func (s *spool) Read(p []byte) (int, error) {
	if s.mrd < len(s.mem) {
		n := copy(p, s.mem[s.mrd:])
		s.mrd += n
		return n, nil
	}
	if s.file == nil {
		return 0, io.EOF
	}
	n, err := s.file.ReadAt(p, s.rd)
	s.rd += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Len returns the bytes held.
func (s *spool) Len() int64 { return s.size }

// Close frees the memory and the file and gives their budgets back.
func (s *spool) Close() error {
	s.lim.memPool.give(s.memHeld)
	s.memHeld, s.mem = 0, nil
	if s.file != nil {
		s.file.Close()
		s.file = nil
		s.lim.disk.give(s.fileLen)
		s.fileLen = 0
	}
	return nil
}

// spoolFrom copies r into sp until r ends or sp takes no more (a budget
// spent, its cap reached); it returns what it read but sp did not take,
// a view of buf. A body or response that streams on goes out as sp, then
// that, then the rest of r (io.Copy would drop it: the upstream or the
// client would get the bytes without that chunk).
func spoolFrom(sp *spool, r io.Reader, buf []byte) ([]byte, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if w, werr := sp.Write(buf[:n]); werr != nil {
				return buf[w:n], werr
			}
		}
		switch {
		case err == io.EOF:
			return nil, nil
		case err != nil:
			return nil, err
		}
	}
}
