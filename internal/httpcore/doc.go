// Package httpcore is the implementation of package httpgate, shared with
// sluice's own servers: the middleware, the decision endpoint, the access
// log, and the exchange API (Snapshot, Admission, Rejection) through which
// sluice proxy's fasthttp server decides requests without net/http.
// Library users import httpgate; its Middleware wraps this package's.
package httpcore
