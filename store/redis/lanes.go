package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Lanes: connections on which the calling goroutine writes its command and
// reads the reply itself (rueidis dedicated connections), for the calls that
// find one idle. rueidis' auto-pipelining hands every command to a writer
// goroutine and every reply back from a reader goroutine: at high
// concurrency that is what lets many calls share one connection, but with
// few calls under way the two hand-offs are latency and CPU spent for
// nothing (measured, bench/sweep_test.go: 4 callers on lanes 10.9 µs per
// decision against 13.1 pipelined). A call takes an idle lane if there is
// one and otherwise goes through the pipelined client at once, so no call
// waits for a lane and a store holds at most maxLanes of them. Lanes are
// opened in the background, never on a caller's path (a dial to a paused
// Redis would hold the caller past its timeout), and checked with a PING
// before use. A lane whose call fails is closed, with every idle one: after
// a restart of Redis each of them would fail its first command.
//
// Standalone Redis only, on a client the store dialed itself, with a
// timeout and a grace for late replies of at most connWriteTimeout
// together: on a Cluster a dedicated connection is bound to one node; a
// caller's client may wait less for a reply than the store's timeout says;
// and rueidis gives up on a reply on a dedicated connection after its
// write timeout, so a longer wait would cut calls short. Every other call
// goes through the pipelined client.

// maxLanes is the most lanes one connection holds: enough for the calls
// that go out alone (soloMax per batching group, each group's batches
// beyond), few enough that a busy store keeps pipelining.
const maxLanes = 8

// lane is one dedicated connection.
type lane struct {
	c       rueidis.DedicatedClient
	release func()
}

// lanes is the set of lanes of one connection. It is safe for concurrent
// use.
type lanes struct {
	mu      sync.Mutex
	idle    []*lane
	held    int  // lanes open: idle or in use
	opening bool // a background open is under way
	closed  bool
	wg      sync.WaitGroup
}

// get returns an idle lane, or nil: then the call goes through the
// pipelined client, and a lane is opened in the background if fewer than
// maxLanes are held. client must be a standalone client.
func (ls *lanes) get(client rueidis.Client, timeout time.Duration) *lane {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if n := len(ls.idle); n > 0 {
		l := ls.idle[n-1]
		ls.idle[n-1] = nil
		ls.idle = ls.idle[:n-1]
		return l
	}
	if !ls.closed && !ls.opening && ls.held < maxLanes {
		ls.opening = true
		ls.wg.Add(1)
		go ls.open(client, timeout)
	}
	return nil
}

// open opens one lane and adds it once it answers a PING within timeout.
func (ls *lanes) open(client rueidis.Client, timeout time.Duration) {
	defer ls.wg.Done()
	c, release := client.Dedicate()
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 100*time.Millisecond))
	err := c.Do(ctx, c.B().Ping().Build()).Error()
	cancel()
	ls.mu.Lock()
	ls.opening = false
	if !answered(err) || ls.closed { // a reply (PING denied by the user's ACL) is an answer
		ls.mu.Unlock()
		release()
		return
	}
	ls.held++
	ls.idle = append(ls.idle, &lane{c: c, release: release})
	ls.mu.Unlock()
}

// put gives back l after a call whose transport error (NonRedisError) was
// err. A lane whose call failed is closed, and so is every idle lane.
func (ls *lanes) put(l *lane, err error) {
	ls.mu.Lock()
	if err == nil && !ls.closed {
		ls.idle = append(ls.idle, l)
		ls.mu.Unlock()
		return
	}
	drop := append(ls.idle, l)
	ls.idle = nil
	ls.held -= len(drop)
	if ls.closed { // closing: nothing may run after Close
		ls.mu.Unlock()
		for _, d := range drop {
			d.release()
		}
		return
	}
	// Given back in the background: rueidis may send a command on a
	// connection it takes back (to end subscriptions), which a paused
	// Redis would not answer.
	ls.wg.Add(1)
	ls.mu.Unlock()
	go func() {
		defer ls.wg.Done()
		for _, d := range drop {
			d.release()
		}
	}()
}

// dropIdle gives every idle lane back to the client (in the background,
// as put does): a probe that found Redis again calls it, since lanes
// opened before the failure (a restart, connections Redis ended) would
// each fail their first command, one decision each on the failure policy.
func (ls *lanes) dropIdle() {
	ls.mu.Lock()
	if len(ls.idle) == 0 || ls.closed { // closing: close gives them back
		ls.mu.Unlock()
		return
	}
	drop := ls.idle
	ls.idle = nil
	ls.held -= len(drop)
	ls.wg.Add(1)
	ls.mu.Unlock()
	go func() {
		defer ls.wg.Done()
		for _, d := range drop {
			d.release()
		}
	}()
}

// close stops opening lanes, waits for an open under way and gives every
// idle lane back to the client; lanes in use are given back by put.
func (ls *lanes) close() {
	ls.mu.Lock()
	ls.closed = true
	ls.mu.Unlock()
	ls.wg.Wait()
	ls.mu.Lock()
	drop := ls.idle
	ls.idle = nil
	ls.held -= len(drop)
	ls.mu.Unlock()
	for _, d := range drop {
		d.release()
	}
}

// scriptText is a script's source and SHA-1, for sending it on a lane
// (rueidis.Lua runs only on a Client).
type scriptText struct{ src, sha string }

// scriptTexts holds every script of the package, by its rueidis.Lua. It is
// written only while the package initializes.
var scriptTexts = map[*rueidis.Lua]scriptText{}

// newScript returns the rueidis.Lua of src and records its text.
func newScript(src string) *rueidis.Lua {
	l := rueidis.NewLuaScript(src)
	sum := sha1.Sum([]byte(src))
	scriptTexts[l] = scriptText{src: src, sha: hex.EncodeToString(sum[:])}
	return l
}

// eval runs sc on l: EVALSHA, and EVAL if Redis does not have the script.
func (l *lane) eval(ctx context.Context, sc *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	t := scriptTexts[sc]
	r := l.c.Do(ctx, l.c.B().Evalsha().Sha1(t.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if re, ok := rueidis.IsRedisErr(r.Error()); ok && re.IsNoScript() {
		r = l.c.Do(ctx, l.c.B().Eval().Script(t.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return r
}

// exec runs sc on an idle lane of cn if there is one (standalone), else
// through cn's pipelined client, with deadline dl.
func (s *Store) exec(ctx context.Context, dl time.Time, cn *connection, sc *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	if s.lanesFor(cn) {
		if l := cn.lanes.get(cn.client, s.opts.Timeout); l != nil {
			r := l.eval(laneContext(ctx, dl), sc, keys, args)
			cn.lanes.put(l, r.NonRedisError())
			return r
		}
	}
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	return sc.Exec(ctx, cn.client, keys, args)
}

// ping sends a PING the way exec sends a script.
func (s *Store) ping(ctx context.Context, dl time.Time, cn *connection) error {
	if s.lanesFor(cn) {
		if l := cn.lanes.get(cn.client, s.opts.Timeout); l != nil {
			r := l.c.Do(laneContext(ctx, dl), l.c.B().Ping().Build())
			cn.lanes.put(l, r.NonRedisError())
			return r.Error()
		}
	}
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	return cn.client.Do(ctx, cn.client.B().Ping().Build()).Error()
}

// laneCtx is the context of a call on a lane: its caller's, with deadline
// dl (or the caller's, if earlier), and no timer. On a dedicated connection
// rueidis sets the deadline on the connection and reads the reply itself,
// never waiting on Done, so a timer would only be armed and stopped; arming
// one that is due before any other wakes an idle P of the Go runtime (a
// futex wake and a thread's round trip through the scheduler), which cost a
// lone caller more than its own share of the call's CPU. The pipelined
// client waits on Done, so its calls keep a real timer (exec).
type laneCtx struct {
	context.Context
	dl time.Time
}

func laneContext(ctx context.Context, dl time.Time) laneCtx {
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	return laneCtx{ctx, dl}
}

func (c laneCtx) Deadline() (time.Time, bool) { return c.dl, true }

func (c laneCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// lanesFor reports whether calls on cn may take lanes (see above).
func (s *Store) lanesFor(cn *connection) bool {
	return !cn.cluster && s.own && s.opts.Timeout+s.opts.ReplyGrace <= connWriteTimeout
}
