package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func request(tenant string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*descpb.RateLimitDescriptor{
		{Entries: []*descpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}}}
}

// The floor answers grpc-go's client as the service does: OK within the
// limit, OVER_LIMIT past it, and 64 concurrent callers on one connection
// past its first flow-control window (64 KiB of answers) all answered.
func TestFloorAnswersGRPC(t *testing.T) {
	f, err := newFloor("../rlsload/config.yaml", "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- f.serve(ln) }()
	defer func() {
		ln.Close()
		<-served
		f.close()
	}()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := rlspb.NewRateLimitServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The hot tenant's limit is 100 a second (a fixed window): 300 calls
	// at once put more than 100 in one window unless they span three,
	// which a burst is tried again for.
	over := 0
	for try := 0; over == 0 && try < 3; try++ {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 300 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := c.ShouldRateLimit(ctx, request("hot"))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Error(err)
				} else if r.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
					over++
				}
			}()
		}
		wg.Wait()
	}
	if over == 0 {
		t.Error("bursts of 300 calls for a tenant limited to 100 a second: none answered OVER_LIMIT")
	}

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				r, err := c.ShouldRateLimit(ctx, request("t"+string(rune('a'+w%26))))
				if err == nil && r.OverallCode != rlspb.RateLimitResponse_OK {
					t.Errorf("a call within its limit answered %v", r.OverallCode)
					return
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
