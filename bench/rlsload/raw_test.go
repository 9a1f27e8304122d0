package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRLS answers OVER_LIMIT for tenant "hot", UNAVAILABLE for tenant
// "down", OK otherwise, and counts its calls.
type fakeRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	mu    sync.Mutex
	calls map[string]int
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, r *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	tenant := r.GetDescriptors()[0].GetEntries()[0].GetValue()
	f.mu.Lock()
	f.calls[r.GetDomain()+"/"+tenant]++
	f.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		return nil, status.Error(codes.InvalidArgument, "no deadline: grpc-timeout was not sent")
	}
	switch tenant {
	case "hot":
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT}, nil
	case "down":
		return nil, status.Error(codes.Unavailable, "store down")
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK,
		Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OK, LimitRemaining: 7}}}, nil
}

// TestRawClient: the raw client's calls reach a grpc-go server as gRPC
// calls, with their deadline, and it reads the overall code and errors
// right, from many concurrent callers on two connections, past the
// server's first 64 KiB flow-control window.
func TestRawClient(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRLS{calls: map[string]int{}}
	srv := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(srv, f)
	go srv.Serve(lis)
	defer srv.Stop()

	var conns []*rawConn
	for range 2 {
		rc, err := dialRaw(lis.Addr().String(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		conns = append(conns, rc)
	}
	ok, hot, down := rawRequest(request("bench", "t1")), rawRequest(request("bench", "hot")), rawRequest(request("bench", "down"))
	const workers, each = 16, 300 // 4,800 calls of ~30 bytes: past 64 KiB
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &rawCall{done: make(chan struct{}, 1)}
			rc := conns[w%len(conns)]
			for i := range each {
				msg, want := ok, rlspb.RateLimitResponse_OK
				switch i % 3 {
				case 1:
					msg, want = hot, rlspb.RateLimitResponse_OVER_LIMIT
				case 2:
					msg = down
				}
				code, err := rc.call(msg, c)
				if i%3 == 2 {
					if err == nil || !strings.Contains(err.Error(), "grpc-status 14") {
						errs <- "an UNAVAILABLE call answered " + code.String() + ", err " + errString(err)
						return
					}
					continue
				}
				if err != nil || code != want {
					errs <- "want " + want.String() + ", got " + code.String() + ", err " + errString(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.calls["bench/t1"] + f.calls["bench/hot"] + f.calls["bench/down"]; n != workers*each {
		t.Errorf("the server saw %d calls, want %d", n, workers*each)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
