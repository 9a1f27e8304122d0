package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Buffering keeps slow clients off the upstream's admitted slots, as
// nginx's request and response buffering do:
//
//   - A request body is read whole into a spool before the request is
//     decided, so a client that sends its body one byte at a time holds no
//     slot while it does (only buffer space, and only until the server's
//     ReadTimeout).
//   - A response is read from the upstream into a spool at the upstream's
//     speed; the request's slot is released when the upstream is done, and
//     the proxy then writes the response to the client, however slowly it
//     reads, within WriteTimeout.
//
// What asks not to be buffered streams and holds its slot, never past the
// request's deadline plus Grace (MaxHold without a deadline): a response
// that flushes (server-sent events, long polls), an upgrade, and a
// response past its cap (MaxResponseBuffer). The shared budgets
// (BufferMemory, BufferDisk) bound what slow clients can cost the proxy;
// a body or a response they cannot hold right now is refused with 503
// (busyBody, busyResponse), never streamed holding a slot for as long as
// its client takes. The first smallBody bytes of each buffer are not
// charged to them: small requests and answers pass when they are spent.

// The details of the 503 answers to what the budgets cannot hold.
const (
	busyBody     = "the proxy's request buffers are full"
	busyResponse = "the proxy's response buffers are full"
)

// bufferLimits returns the spool limits of request bodies or responses.
func (s *Server) bufferLimits(max int64) spoolLimits {
	return spoolLimits{memory: 64 << 10, free: smallBody, max: max, memPool: s.memBudget, disk: s.diskBudget, dir: s.opts.BufferDir}
}

// buffered is the proxy's handler: bodies in, then the middleware and the
// upstream, then the response out.
func (s *Server) buffered(inner http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" || r.Method == http.MethodConnect {
			s.mw.Invalid(w, r, "method "+r.Method+" is not proxied")
			return
		}
		if expectsContinue(r) {
			// Decided before its body comes: the body is read once the
			// request is admitted (readExpected), and net/http's server
			// sends 100 Continue at that first read; a refusal goes out
			// with no 100 and the body unread.
			r = r.WithContext(context.WithValue(r.Context(), expectKey{}, true))
		} else {
			body, ok := s.readBody(w, r)
			if !ok {
				return
			}
			if body != nil {
				defer body.Close()
			}
		}
		bw := &bufferedWriter{client: w, header: w.Header(), body: newSpool(s.bufferLimits(s.opts.MaxResponseBuffer)), grace: s.opts.Grace, maxHold: s.opts.MaxHold}
		defer bw.body.Close()
		defer func() {
			switch {
			case bw.full:
				// The copy's error aborted ReverseProxy's handler
				// (http.ErrAbortHandler): the refusal goes out instead.
				if p := recover(); p != nil && p != http.ErrAbortHandler {
					panic(p)
				}
				clear(bw.header)
				s.mw.Busy(w, r, busyResponse)
			case !bw.stream:
				p := recover()
				if p == nil {
					return
				}
				if p != http.ErrAbortHandler {
					panic(p)
				}
				// The upstream's answer broke off after its head (closed,
				// short of its length, a broken chunk, silent past the
				// deadline): ReverseProxy aborts, which closed the
				// client's connection with no answer at all. Nothing of
				// it reached the client: a 502, or a 504 past the
				// request's deadline, as on the proxy's own server.
				clear(bw.header)
				err := errBrokeOff
				switch {
				case s.cut.Err() != nil:
					err = context.Canceled // the drain cut it: not the upstream's failure
				case !bw.due.IsZero() && !time.Now().Before(bw.due):
					err = context.DeadlineExceeded
				}
				s.upstreamError(w, r, err)
			}
		}()
		inner.ServeHTTP(bw, r)
		bw.finish(r, s.opts.WriteTimeout)
	})
}

// errBrokeOff is the failure of an upstream answer that broke off after
// its head, on the net/http front (ReverseProxy does not say why).
var errBrokeOff = errors.New("the upstream's answer broke off after its head")

// expectKey marks a request with Expect: 100-continue whose body is read
// only once it is admitted.
type expectKey struct{}

// expectsContinue reports a request with a body that waits for 100
// Continue before sending it.
func expectsContinue(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue")
}

// readExpected reads the body of an admitted request that waited for 100
// Continue (the read sends it), holding its slot: the client was told to
// send it now. It reports false when it answered the request itself (a
// body too large or broken).
func (s *Server) readExpected(w http.ResponseWriter, r *http.Request) (*spool, bool) {
	if r.Context().Value(expectKey{}) == nil {
		return nil, true
	}
	return s.readBody(w, r)
}

// readBody reads r's body into a spool and makes it r's body. It answers
// itself and reports false for a body that is too large or broken (413,
// 400: the client's fault; the upstream never sees it), and for one the
// shared budgets cannot hold right now (503, busyBody: a body that
// streamed would hold an admitted slot for as long as its sender takes).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (*spool, bool) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, true
	}
	if r.ContentLength > s.opts.MaxBodyBytes {
		s.mw.InvalidStatus(w, r, http.StatusRequestEntityTooLarge, "request body of "+strconv.FormatInt(r.ContentLength, 10)+" bytes, more than the "+strconv.FormatInt(s.opts.MaxBodyBytes, 10)+" the proxy takes")
		return nil, false
	}
	sp := newSpool(s.bufferLimits(s.opts.MaxBodyBytes))
	bp := s.copyBufs.get()
	_, err := spoolFrom(sp, io.LimitReader(r.Body, s.opts.MaxBodyBytes+1), *bp)
	s.copyBufs.put(bp)
	n := sp.Len()
	switch {
	case err == nil && n > s.opts.MaxBodyBytes, errors.Is(err, errSpoolCap):
		sp.Close()
		s.mw.InvalidStatus(w, r, http.StatusRequestEntityTooLarge, "request body more than the "+strconv.FormatInt(s.opts.MaxBodyBytes, 10)+" bytes the proxy takes")
		return nil, false
	case errors.Is(err, errSpoolFull):
		// The budgets are spent: refused before it holds a slot.
		sp.Close()
		w.Header().Set("Connection", "close")
		s.mw.Busy(w, r, busyBody)
		return nil, false
	case err != nil:
		sp.Close()
		s.mw.Invalid(w, r, "request body unreadable: "+err.Error())
		return nil, false
	}
	r.Body.Close()
	r.Body = io.NopCloser(sp)
	r.ContentLength = n
	r.TransferEncoding = nil
	return sp, true
}

// bufferedWriter is the ResponseWriter the middleware and the upstream
// see: it keeps the response in a spool, or streams it to the client once
// buffering is not possible (a flush, an upgrade, a full spool).
type bufferedWriter struct {
	client   http.ResponseWriter
	header   http.Header // the client's: headers written before streaming
	body     *spool
	status   int
	stream   bool      // writing through to the client
	full     bool      // refused: the budgets could not hold it
	deadline time.Time // when the slot is given back at the latest (holdEnd)
	due      time.Time // the request's own deadline (zero: none)
	grace    time.Duration
	maxHold  time.Duration
	err      error
	// own holds the values of each of ownAnswerNames sluice had set when the
	// request was admitted (markOwn; none before it).
	own [len(ownAnswerNames)][]string
}

// markOwn keeps the admitted answer's own fields, set before the reverse
// proxy copies the upstream's after them. WriteHeader puts back sluice's
// values of each name it set: an upstream's fields of the same names do
// not reach the client beside them, and the fields survive the reverse
// proxy's clearing of the header after an informational answer (103
// Early Hints).
func (b *bufferedWriter) markOwn() {
	for i, n := range ownAnswerNames {
		vs := b.header[n]
		b.own[i] = vs[:len(vs):len(vs)] // appends after it go elsewhere
	}
}

// restoreOwn puts back the values markOwn kept (WriteHeader calls it
// once, at the final status).
func (b *bufferedWriter) restoreOwn() {
	for i, n := range ownAnswerNames {
		if vs := b.own[i]; len(vs) > 0 {
			b.header[n] = vs
		}
	}
}

// hideOwn takes sluice's values (markOwn) out of the header before an
// interim answer, which carries the upstream's fields only: the reverse
// proxy adds the upstream's to the header the admission wrote, and clears
// it after; restoreOwn puts sluice's back at the final status.
func (b *bufferedWriter) hideOwn() {
	for i, n := range ownAnswerNames {
		own, vs := b.own[i], b.header[n]
		if len(own) == 0 || len(vs) < len(own) || &vs[0] != &own[0] {
			continue // none set, or not sluice's any more (cleared after an earlier one)
		}
		if len(vs) == len(own) {
			delete(b.header, n)
		} else {
			b.header[n] = vs[len(own):]
		}
	}
}

// dropOwnNames deletes from h (an upstream's answer) the fields of each
// name sluice set on the admitted answer (markOwn).
func (b *bufferedWriter) dropOwnNames(h http.Header) {
	for i, n := range ownAnswerNames {
		if len(b.own[i]) > 0 {
			h.Del(n)
		}
	}
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		b.hideOwn()
		b.client.WriteHeader(code) // informational: straight through
		return
	}
	if b.status != 0 {
		return
	}
	b.restoreOwn()
	b.status = code
	if b.stream {
		b.writeHeader()
	}
}

// writeHeader writes the status to the client, without the Content-Type
// net/http's server would guess for an answer the upstream sent without
// one: a proxy passes what the upstream sent (the proxy's own server
// does).
func (b *bufferedWriter) writeHeader() {
	if _, ok := b.header["Content-Type"]; !ok {
		b.header["Content-Type"] = nil
	}
	b.client.WriteHeader(b.status)
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	switch {
	case b.full:
		return 0, errSpoolFull // refused already: nothing more is kept
	case b.stream:
		return b.client.Write(p)
	}
	n, err := b.body.Write(p)
	if err == nil {
		return n, nil
	}
	if errors.Is(err, errSpoolFull) {
		// The budgets are spent: the response is refused (buffered answers
		// 503), not streamed holding its slot for as long as its client
		// takes. The error ends the upstream's call (ReverseProxy aborts
		// the handler; buffered recovers).
		b.full = true
		b.body.Close()
		return n, err
	}
	b.startStream()
	if b.err != nil {
		return n, b.err
	}
	m, err := b.client.Write(p[n:])
	return n + m, err
}

// startStream turns buffering off: what is buffered goes to the client,
// and from now on writes go straight through, under a write deadline of
// the request's deadline plus the grace, so a slow reader cannot hold the
// slot longer.
func (b *bufferedWriter) startStream() {
	if b.stream {
		return
	}
	b.stream = true
	if !b.deadline.IsZero() {
		http.NewResponseController(b.client).SetWriteDeadline(b.deadline)
	}
	if b.status != 0 {
		b.writeHeader()
	}
	if b.body.Len() > 0 {
		_, b.err = io.Copy(b.client, b.body)
	}
}

// setDeadline records when an admitted request's slot is given back at
// the latest, however its response streams: its deadline plus the grace,
// or MaxHold from now without one (holdEnd). Reading the body it reads
// after its admission (Expect: 100-continue) is bounded by it too.
func (b *bufferedWriter) setDeadline(r *http.Request) {
	dl, _ := r.Context().Deadline()
	b.due = dl
	b.deadline = holdEnd(dl, b.grace, b.maxHold, time.Now())
	if !b.deadline.IsZero() {
		http.NewResponseController(b.client).SetReadDeadline(b.deadline)
	}
}

// holdEnd is when a request admitted at now with deadline (zero: none)
// gives back its slot at the latest: the deadline plus grace, or now plus
// maxHold (zero: no bound, for a negative MaxHold).
func holdEnd(deadline time.Time, grace, maxHold time.Duration, now time.Time) time.Time {
	switch {
	case !deadline.IsZero():
		return deadline.Add(grace)
	case maxHold > 0:
		return now.Add(maxHold)
	}
	return time.Time{}
}

// Flush streams a response that asks to be streamed: server-sent events,
// or an upstream's "X-Accel-Buffering: no" (nginx's convention). Other
// flushes (httputil.ReverseProxy flushes every response without a
// Content-Length) are no reason to hold the slot while a client reads.
func (b *bufferedWriter) Flush() {
	if !b.stream && !streamed(b.header) {
		return
	}
	b.startStream()
	http.NewResponseController(b.client).Flush()
}

// streamed reports whether a response's headers ask for streaming.
func streamed(h http.Header) bool {
	if strings.EqualFold(h.Get("X-Accel-Buffering"), "no") {
		return true
	}
	ct, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// Hijack hands the connection over (an upgrade); it holds its slot.
func (b *bufferedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	b.stream = true
	return http.NewResponseController(b.client).Hijack()
}

// finish writes a buffered response to the client, within timeout: the
// slot was already released, so only the proxy's buffer waits on a slow
// reader.
func (b *bufferedWriter) finish(r *http.Request, timeout time.Duration) {
	if b.stream || b.full {
		return
	}
	if b.status == 0 {
		b.status = http.StatusOK
	}
	bodyless := r.Method == http.MethodHead || b.status == http.StatusNoContent || b.status == http.StatusNotModified
	if !bodyless && b.header.Get("Content-Length") == "" && b.header.Get("Transfer-Encoding") == "" {
		b.header.Set("Content-Length", strconv.FormatInt(b.body.Len(), 10))
	}
	http.NewResponseController(b.client).SetWriteDeadline(time.Now().Add(timeout))
	b.writeHeader()
	io.Copy(b.client, b.body)
}

// bufferedOf finds the bufferedWriter under the middleware's writer.
func bufferedOf(w http.ResponseWriter) *bufferedWriter {
	for {
		switch x := w.(type) {
		case *bufferedWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}
