// Command rlsfloor is a measurement, not a server to run: the rate limit
// service of grpcgate/rls (the one `sluice serve` runs) behind a gRPC
// transport of a few hundred lines instead of grpc-go, to measure what
// grpc-go's transport costs a call (bench/rlsload drives both alike).
//
//	go run ./rlsfloor -config rlsload/config.yaml -listen 127.0.0.1:19081 [-redis 127.0.0.1:6379]
//
// It speaks only what one unary method needs, on golang.org/x/net/http2's
// framer: the client preface, SETTINGS and PING acknowledged, the
// connection's send window kept, a request's HEADERS and DATA frames
// gathered until its stream ends, then the answer (HEADERS, one DATA frame
// with the gRPC message, trailers with grpc-status) written with the
// answers of concurrent calls in one system call. It does not read
// headers (any path is ShouldRateLimit; no grpc-timeout, no metadata),
// bound streams, frames or connections, answer errors with a status, or
// send GOAWAY. What that would take is the difference between this floor
// and a server; docs/benchmarks/rls.md has what the floor measured.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"sync/atomic"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/grpcgate/envoyrls"
	"github.com/sluice-go/sluice/grpcgate/rls"
	sredis "github.com/sluice-go/sluice/store/redis"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19081", "address to serve on")
	config := flag.String("config", "", "the rate limit configuration (envoyproxy/ratelimit's format), e.g. rlsload/config.yaml")
	redis := flag.String("redis", "", "Redis address (default: counters in memory)")
	flag.Parse()
	f, err := newFloor(*config, *redis)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsfloor:", err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsfloor:", err)
		os.Exit(2)
	}
	log.Printf("rlsfloor: serving on %s", ln.Addr())
	log.Fatal(f.serve(ln))
}

// floor is the service and the two header blocks every answer carries.
type floor struct {
	rs            *envoyrls.Server
	head, trailer []byte
	conns         sync.WaitGroup
	mu            sync.Mutex
	open          map[net.Conn]bool
}

func newFloor(config, redis string) (*floor, error) {
	cfg, err := rls.Load(config)
	if err != nil {
		return nil, err
	}
	ro := rls.Options{Registry: prometheus.NewRegistry()}
	if redis != "" {
		if ro.Redis, err = sredis.New(sredis.Options{Addrs: []string{redis}}); err != nil {
			return nil, err
		}
	}
	svc, err := rls.New(cfg, ro)
	if err != nil {
		return nil, err
	}
	rs, err := envoyrls.New(svc, envoyrls.Options{})
	if err != nil {
		return nil, err
	}
	f := &floor{rs: rs, open: map[net.Conn]bool{}}
	var b bytes.Buffer
	e := hpack.NewEncoder(&b)
	for _, h := range []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}} {
		if err := e.WriteField(h); err != nil {
			return nil, err
		}
	}
	f.head = bytes.Clone(b.Bytes())
	b.Reset()
	if err := e.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"}); err != nil {
		return nil, err
	}
	f.trailer = bytes.Clone(b.Bytes())
	return f, nil
}

// serve serves connections from ln until it fails (it is closed).
func (f *floor) serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.open[c] = true
		f.mu.Unlock()
		f.conns.Add(1)
		go func() {
			defer f.conns.Done()
			f.conn(c)
			f.mu.Lock()
			delete(f.open, c)
			f.mu.Unlock()
		}()
	}
}

// close closes every connection and waits for their readers.
func (f *floor) close() {
	f.mu.Lock()
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	f.conns.Wait()
}

// floorConn is one client connection: its framer's writes under wmu, and
// the connection's send window.
type floorConn struct {
	f      *floor
	wmu    sync.Mutex
	w      *bufio.Writer
	fr     *http2.Framer
	win    int64
	winned *sync.Cond
	queued atomic.Int32 // answers waiting to write: the last one flushes
	calls  sync.WaitGroup
	failed bool // under wmu: a write failed, the connection is done
}

// conn reads c's frames until it fails, and answers each call on a
// goroutine of its own (a call may wait for Redis).
func (f *floor) conn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fc := &floorConn{f: f, w: bufio.NewWriterSize(c, 64<<10), win: 65535}
	fc.winned = sync.NewCond(&fc.wmu)
	fc.fr = http2.NewFramer(fc.w, r)
	fc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	defer fc.calls.Wait()
	defer fc.fail() // wakes answers waiting for window
	if !fc.write(func() error {
		if err := fc.fr.WriteSettings(); err != nil {
			return err
		}
		return fc.fr.WriteWindowUpdate(0, 1<<30) // the client may send as it likes
	}) {
		return
	}
	bodies := map[uint32][]byte{}
	for {
		fr, err := fc.fr.ReadFrame()
		if err != nil {
			return
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() && !fc.write(fc.fr.WriteSettingsAck) {
				return
			}
		case *http2.PingFrame:
			if d := fr.Data; !fr.IsAck() && !fc.write(func() error { return fc.fr.WritePing(true, d) }) {
				return
			}
		case *http2.WindowUpdateFrame:
			if fr.StreamID == 0 {
				fc.wmu.Lock()
				fc.win += int64(fr.Increment)
				fc.winned.Broadcast()
				fc.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			bodies[fr.StreamID] = nil
		case *http2.DataFrame:
			b := append(bodies[fr.StreamID], fr.Data()...)
			if !fr.StreamEnded() {
				bodies[fr.StreamID] = b
				continue
			}
			delete(bodies, fr.StreamID)
			fc.calls.Add(1)
			go fc.answer(fr.StreamID, b)
		case *http2.RSTStreamFrame:
			delete(bodies, fr.StreamID)
		}
	}
}

// write runs w on the framer and flushes; false when the connection failed.
func (fc *floorConn) write(w func() error) bool {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	if fc.failed {
		return false
	}
	if err := w(); err != nil || fc.w.Flush() != nil {
		fc.failed = true
		fc.winned.Broadcast()
	}
	return !fc.failed
}

// fail marks the connection done.
func (fc *floorConn) fail() {
	fc.wmu.Lock()
	fc.failed = true
	fc.winned.Broadcast()
	fc.wmu.Unlock()
}

// answer decides the call whose gRPC message is msg and writes its answer
// on stream id.
func (fc *floorConn) answer(id uint32, msg []byte) {
	defer fc.calls.Done()
	var req rlspb.RateLimitRequest
	if len(msg) < 5 || proto.Unmarshal(msg[5:], &req) != nil {
		return // a measurement's client sends none: the stream stays open
	}
	resp, err := fc.f.rs.ShouldRateLimit(context.Background(), &req)
	if err != nil {
		return
	}
	out, err := proto.Marshal(resp)
	if err != nil {
		return
	}
	data := make([]byte, 5+len(out))
	binary.BigEndian.PutUint32(data[1:], uint32(len(out)))
	copy(data[5:], out)
	fc.queued.Add(1)
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	for fc.win < int64(len(data)) && !fc.failed {
		// What is written waits for no window: out with it, or the
		// client never sees the answers that would refill this one.
		if fc.w.Buffered() > 0 && fc.w.Flush() != nil {
			fc.failed = true
			break
		}
		fc.winned.Wait()
	}
	last := fc.queued.Add(-1) == 0
	if fc.failed {
		return
	}
	fc.win -= int64(len(data))
	err = fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.f.head, EndHeaders: true})
	if err == nil {
		err = fc.fr.WriteData(id, false, data)
	}
	if err == nil {
		err = fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.f.trailer, EndHeaders: true, EndStream: true})
	}
	if err == nil && last {
		err = fc.w.Flush()
	}
	if err != nil {
		fc.failed = true
		fc.winned.Broadcast()
	}
}
