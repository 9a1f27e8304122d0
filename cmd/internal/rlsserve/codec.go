package rlsserve

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// decodeCodec is the servers' codec: gRPC's own for protocol buffers,
// except that a call's message that does not decode (a string that is
// not UTF-8, a truncated or malformed message) is answered
// INVALID_ARGUMENT, the caller's fault, as every other malformed request
// is. grpc-go answers a codec's error INTERNAL, which reads as a fault of
// the server's, and writes that answer itself: so the error is kept here,
// by message, and the handler's read of its message (callGuard.wrap)
// returns it.
type decodeCodec struct {
	inner   encoding.CodecV2
	pending atomic.Int64 // entries in bad: none, and no call looks there
	bad     sync.Map     // message (the pointer a handler decodes into) → error
}

func newDecodeCodec() *decodeCodec {
	return &decodeCodec{inner: encoding.GetCodecV2(proto.Name)}
}

func (c *decodeCodec) Name() string { return c.inner.Name() }

func (c *decodeCodec) Marshal(v any) (mem.BufferSlice, error) { return c.inner.Marshal(v) }

// maxPending bounds the errors kept at once: past it (more undecodable
// messages than calls in progress, which a missed read-back would mean) a
// message that does not decode is grpc-go's INTERNAL again, and nothing
// more is kept.
const maxPending = MaxCalls

// Unmarshal decodes data into v; when it cannot, it keeps the error for
// v's handler (undecoded) and reports none to grpc-go.
func (c *decodeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.inner.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	if c.pending.Load() >= maxPending {
		return err
	}
	if _, kept := c.bad.Swap(v, err); !kept {
		c.pending.Add(1)
	}
	return nil
}

// undecoded returns, once, the INVALID_ARGUMENT answer to a message m
// that did not decode, or nil. Every read of a message calls it, whatever
// the read returned: grpc-go reads on after decoding a call's one message
// (its end, or a second message), and a read that failed there would
// leave the error kept for good.
func (c *decodeCodec) undecoded(m any) error {
	if c.pending.Load() == 0 {
		return nil
	}
	e, ok := c.bad.LoadAndDelete(m)
	if !ok {
		return nil
	}
	c.pending.Add(-1)
	return status.Errorf(codes.InvalidArgument, "sluice serve: the call's message does not decode: %v", e)
}
