package grpcgate_test

import (
	"context"
	"net/netip"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/grpcgate"
)

// A call from a trusted peer carrying sluice-class is lowered to it (never
// raised), and the handler finds its class in its context; from an
// untrusted peer the metadata is ignored.
func TestPeerClassOverGRPC(t *testing.T) {
	for _, c := range []struct {
		trusted     string
		sent, want  string
		method      string
		handlerSees string
	}{
		{"127.0.0.0/8", "sheddable", sluice.ClassSheddable, "Critical", sluice.ClassSheddable},
		{"127.0.0.0/8", "critical", sluice.ClassSheddable, "Unary", sluice.ClassSheddable},
		{"10.0.0.0/8", "sheddable", sluice.ClassCritical, "Critical", sluice.ClassCritical},
	} {
		rules := testRules
		rules.Peers.Trusted = []netip.Prefix{netip.MustParsePrefix(c.trusted)}
		f := newFixture(t, 10, grpcgate.Options{Rules: rules})
		seen := make(chan string, 1)
		f.setUnary(func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			seen <- sluice.ClassFrom(ctx)
			return in, nil
		})
		r := f.call(t, c.method, "x-api-key", "acme", "sluice-class", c.sent)
		must(t, r.err)
		if req, _ := f.probe.seen(); req.Class != c.want {
			t.Errorf("trusted %s, %s sent %q: class %q, want %q", c.trusted, c.method, c.sent, req.Class, c.want)
		}
		if got := <-seen; got != c.handlerSees {
			t.Errorf("trusted %s: the handler's context says %q, want %q", c.trusted, got, c.handlerSees)
		}
	}
}

// The client interceptors pass on what the caller's request was admitted
// as: a downstream server that trusts the caller lowers the call to it.
func TestClientInterceptorPropagatesTheClass(t *testing.T) {
	r, err := client.New(client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules := testRules
	rules.Peers.Trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	f := newFixture(t, 10, grpcgate.Options{Rules: rules},
		grpc.WithUnaryInterceptor(grpcgate.UnaryClientInterceptor(r, grpcgate.ClientOptions{})))
	ctx := sluice.ContextWithLevel(sluice.ContextWithClass(context.Background(), sluice.ClassSheddable), sluice.LevelDegrade)
	got := make(chan [2]string, 1)
	f.setUnary(func(ctx context.Context, _ string, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		got <- [2]string{sluice.ClassFrom(ctx), firstMD(ctx, grpcgate.LevelKey)}
		return in, nil
	})
	res := f.callCtx(ctx, "Critical", "x-api-key", "acme", "sluice-class", "critical")
	must(t, res.err)
	if req, _ := f.probe.seen(); req.Class != sluice.ClassSheddable {
		t.Errorf("downstream decided class %q, want the caller's sheddable", req.Class)
	}
	if g := <-got; g != [2]string{sluice.ClassSheddable, "degrade"} {
		t.Errorf("downstream handler: class %q, level metadata %q", g[0], g[1])
	}
}

func firstMD(ctx context.Context, key string) string {
	if vs := metadata.ValueFromIncomingContext(ctx, key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}
