package identify_test

import (
	"fmt"
	"net/http/httptest"
	"net/netip"

	"github.com/sluice-go/sluice/identify"
)

// A key function per client IP: behind the load balancers of 10.0.0.0/8
// the client is the right-most address of X-Forwarded-For that is not one
// of them; IPv6 clients share a key per /64. A peer outside 10.0.0.0/8 is
// keyed by its own address, whatever it writes in X-Forwarded-For.
func ExampleKey() {
	lb, _ := identify.ParseTrustedProxy("10.0.0.0/8")
	key, _ := identify.Key(identify.KeyRules{
		Parts:    []identify.Part{identify.FromClientIP()},
		ClientIP: identify.ClientIP{TrustedProxies: []netip.Prefix{lb}, IPv6Prefix: 64},
	})
	for _, c := range []struct{ peer, xff string }{
		{"10.1.2.3:4711", "198.51.100.7"},                     // through the load balancer
		{"10.1.2.3:4711", "6.6.6.6, 198.51.100.7"},            // the client's own entry is ignored
		{"203.0.113.9:5000", "198.51.100.7"},                  // not from a load balancer: spoofed
		{"10.1.2.3:4711", "2001:db8:aa:bb::1"},                // IPv6, grouped by /64
		{"10.1.2.3:4711", "2001:db8:aa:bb:ffff::2, 10.9.9.9"}, // same /64, another hop
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		r.Header.Set("X-Forwarded-For", c.xff)
		k, err := key(r)
		fmt.Println(k, err)
	}
	// Output:
	// 198.51.100.7 <nil>
	// 198.51.100.7 <nil>
	// 203.0.113.9 <nil>
	// 2001:db8:aa:bb::/64 <nil>
	// 2001:db8:aa:bb::/64 <nil>
}
