package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// The raw client (-client raw): gRPC's wire format written by hand on
// golang.org/x/net/http2's framer, so that the generator's own CPU per
// call is a fraction of grpc-go's client (on a 2-core machine the
// generator shares the cores with the service it measures, and grpc-go's
// client costs about as much as its server). Each call is one HEADERS
// frame (a header block encoded once: every field never indexed, so the
// block is the same on every stream) and one DATA frame (the request
// marshalled once per tenant), multiplexed on the connection like any
// HTTP/2 client's, Envoy's among them; the writes of concurrent calls go
// out in one system call. The answer is the overall code, read from the
// response's first field, and grpc-status from the trailers. Nothing else
// of gRPC is needed to call one unary method: no compression, no
// metadata, no retries.

const rawPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// rawConn is one HTTP/2 connection to a target.
type rawConn struct {
	c      net.Conn
	block  []byte // the HEADERS block of every call
	wmu    sync.Mutex
	w      *bufio.Writer
	fr     *http2.Framer // writes under wmu; reads on the reader goroutine only
	nextID uint32
	queued atomic.Int32 // calls waiting to write: the last one flushes

	// the connection's send window (only DATA counts), which the
	// server's WINDOW_UPDATEs refill
	win     int64
	winCond *sync.Cond

	mu      sync.Mutex
	streams map[uint32]*rawCall
	err     error // set when the connection failed: every call fails
}

// rawCall is one call's answer.
type rawCall struct {
	done chan struct{}
	code rlspb.RateLimitResponse_Code
	err  error
}

// rawRequest is one request's framed message: the 5-byte gRPC prefix and
// the marshalled RateLimitRequest.
func rawRequest(req *rlspb.RateLimitRequest) []byte {
	b, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	msg := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(b)))
	copy(msg[5:], b)
	return msg
}

// grpcTimeout encodes d as a grpc-timeout value (at most 8 digits).
func grpcTimeout(d time.Duration) string {
	if ms := d.Milliseconds(); ms < 1e8 {
		return strconv.FormatInt(ms, 10) + "m"
	}
	return strconv.FormatInt(int64(d.Seconds()), 10) + "S"
}

const rawWindow = 1 << 30 // what this client lets the server send, per stream and in all

func dialRaw(addr string, timeout time.Duration) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", rawPath}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-timeout", grpcTimeout(timeout)}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true}); err != nil {
			return nil, err
		}
	}
	rc := &rawConn{c: c, block: hb.Bytes(), w: bufio.NewWriterSize(c, 64<<10), nextID: 1, win: 65535, streams: map[uint32]*rawCall{}}
	rc.winCond = sync.NewCond(&rc.wmu)
	rc.fr = http2.NewFramer(rc.w, bufio.NewReaderSize(c, 64<<10))
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := rc.w.WriteString(http2.ClientPreface); err != nil {
		return nil, err
	}
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: rawWindow}); err != nil {
		return nil, err
	}
	if err := rc.fr.WriteWindowUpdate(0, rawWindow-65535); err != nil {
		return nil, err
	}
	if err := rc.w.Flush(); err != nil {
		return nil, err
	}
	go rc.read()
	return rc, nil
}

// call sends msg and waits for the answer.
func (rc *rawConn) call(msg []byte, rcall *rawCall) (rlspb.RateLimitResponse_Code, error) {
	rc.queued.Add(1)
	rc.wmu.Lock()
	for rc.win < int64(len(msg)) && rc.failed() == nil {
		rc.winCond.Wait()
	}
	if err := rc.failed(); err != nil {
		rc.queued.Add(-1)
		rc.wmu.Unlock()
		return 0, err
	}
	id := rc.nextID
	rc.nextID += 2
	rc.mu.Lock()
	rc.streams[id] = rcall
	rc.mu.Unlock()
	rc.win -= int64(len(msg))
	err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.block, EndHeaders: true})
	if err == nil {
		err = rc.fr.WriteData(id, true, msg)
	}
	if rc.queued.Add(-1) == 0 && err == nil {
		err = rc.w.Flush()
	}
	rc.wmu.Unlock()
	if err != nil {
		rc.fail(err)
	}
	<-rcall.done
	return rcall.code, rcall.err
}

func (rc *rawConn) failed() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err
}

// fail ends the connection and every call on it.
func (rc *rawConn) fail(err error) {
	rc.mu.Lock()
	if rc.err == nil {
		rc.err = err
		for id, c := range rc.streams {
			c.err = err
			c.done <- struct{}{}
			delete(rc.streams, id)
		}
	}
	rc.mu.Unlock()
	rc.c.Close()
	rc.wmu.Lock()
	rc.winCond.Broadcast()
	rc.wmu.Unlock()
}

// finish hands a stream's answer to its call.
func (rc *rawConn) finish(id uint32, code rlspb.RateLimitResponse_Code, err error) {
	rc.mu.Lock()
	c := rc.streams[id]
	delete(rc.streams, id)
	rc.mu.Unlock()
	if c != nil {
		c.code, c.err = code, err
		c.done <- struct{}{}
	}
}

// control writes a frame the reader owes the server (a SETTINGS or PING
// acknowledgement, a WINDOW_UPDATE).
func (rc *rawConn) control(write func() error) {
	rc.wmu.Lock()
	err := write()
	if err == nil {
		err = rc.w.Flush()
	}
	rc.wmu.Unlock()
	if err != nil {
		rc.fail(err)
	}
}

// read is the connection's reader: it answers the server's control frames
// and finishes calls.
func (rc *rawConn) read() {
	codes := map[uint32]rlspb.RateLimitResponse_Code{} // streams whose message came
	var received int64
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			rc.fail(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			// (The server's stream windows do not matter: every request is
			// far below the smallest, 64 KiB.)
			if !f.IsAck() {
				rc.control(rc.fr.WriteSettingsAck)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				rc.control(func() error { return rc.fr.WritePing(true, data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				rc.wmu.Lock()
				rc.win += int64(f.Increment)
				rc.winCond.Broadcast()
				rc.wmu.Unlock()
			}
		case *http2.DataFrame:
			d := f.Data()
			received += int64(len(d))
			if received > rawWindow/2 {
				n := uint32(received)
				received = 0
				rc.control(func() error { return rc.fr.WriteWindowUpdate(0, n) })
			}
			// The message: 5 bytes of prefix, then the response, whose
			// field 1 (overall_code, a varint) comes first when set.
			code := rlspb.RateLimitResponse_UNKNOWN
			if len(d) >= 7 && d[5] == 0x08 {
				code = rlspb.RateLimitResponse_Code(d[6])
			}
			codes[f.StreamID] = code
			if f.StreamEnded() {
				delete(codes, f.StreamID)
				rc.finish(f.StreamID, code, errors.New("no trailers"))
			}
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				break // the response headers
			}
			status, msg := "", ""
			for _, hf := range f.RegularFields() {
				switch hf.Name {
				case "grpc-status":
					status = hf.Value
				case "grpc-message":
					msg = hf.Value
				}
			}
			code, ok := codes[f.StreamID]
			delete(codes, f.StreamID)
			switch {
			case status == "":
				rc.finish(f.StreamID, 0, fmt.Errorf("HTTP status %s without grpc-status", f.PseudoValue("status")))
			case status != "0":
				rc.finish(f.StreamID, 0, fmt.Errorf("grpc-status %s: %s", status, msg))
			case !ok:
				rc.finish(f.StreamID, 0, errors.New("no response message"))
			default:
				rc.finish(f.StreamID, code, nil)
			}
		case *http2.RSTStreamFrame:
			delete(codes, f.StreamID)
			rc.finish(f.StreamID, 0, fmt.Errorf("stream reset: %v", f.ErrCode))
		case *http2.GoAwayFrame:
			rc.fail(fmt.Errorf("GOAWAY %v", f.ErrCode))
			return
		}
	}
}

func (rc *rawConn) Close() { rc.fail(errors.New("closed")) }
