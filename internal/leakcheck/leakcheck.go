// Package leakcheck holds the goroutine leak checks' exceptions shared by
// the test packages: goroutines that libraries start once per process or
// that end on their own shortly after their owner closed.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }
package leakcheck

import "go.uber.org/goleak"

// Ignore returns the goleak options for the libraries' own background
// goroutines:
//   - fasthttp (the proxy's server): the once-per-process date updater and
//     DNS cache cleaner; a stopped server's worker-pool cleaner and a
//     closed client's idle-connection cleaner, which each sleep out their
//     period (at most 90 s) and end.
//   - rueidis: a delayed retry of a topology refresh, sleeping for a few
//     seconds after a node died and its client closed.
func Ignore() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
	}
}
