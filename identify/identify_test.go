package identify

import (
	"testing"

	"github.com/sluice-go/sluice"
)

// Case, slash and dot-segment variants of a route's path, which common
// upstream routers (Express: case-insensitive, trailing slash ignored)
// serve with the same handler, get the route's class: before, a client
// asking for /V1/ANALYTICS/x escaped the sheddable budget as default.
func TestLenientPathsMatchTheirRoute(t *testing.T) {
	id, err := New(Rules{Routes: []Route{
		{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
		{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, class string }{
		{"GET", "/v1/analytics/x", sluice.ClassSheddable},
		{"GET", "/V1/ANALYTICS/x", sluice.ClassSheddable},
		{"GET", "/v1/Analytics/x/", sluice.ClassSheddable},
		{"GET", "//v1//analytics//x", sluice.ClassSheddable},
		{"GET", "/v1/./analytics/x", sluice.ClassSheddable},
		{"GET", "/v1/foo/../analytics/x", sluice.ClassSheddable},
		{"GET", "/v1/analytics/x/../y", sluice.ClassSheddable},
		{"POST", "/V1/Routes/", sluice.ClassCritical},
		{"POST", "/v1/routes/..", sluice.ClassDefault}, // that is /v1
		{"GET", "/v1/analytics", sluice.ClassDefault},  // the route needs a segment after it
		{"GET", "/", sluice.ClassDefault},
		// ;parameters, which servlet containers drop before routing
		{"GET", "/v1/analytics;jsessionid=1/x", sluice.ClassSheddable},
		{"GET", "/v1;a=b/analytics/x;y", sluice.ClassSheddable},
		{"POST", "/v1/routes;v=2", sluice.ClassCritical},
		{"GET", "/v1/analytics/;x", sluice.ClassDefault}, // an empty segment is no segment
	} {
		var req sluice.Request
		if _, detail := id.Identify(c.method, c.path, nil, &req); detail != "" || req.Class != c.class {
			t.Errorf("%s %s: class %q (%s), want %q", c.method, c.path, req.Class, detail, c.class)
		}
	}
}

// PathExact matches as written.
func TestExactPaths(t *testing.T) {
	id, err := New(Rules{PathMatch: PathExact, Routes: []Route{{Path: "/v1/analytics/*", Class: sluice.ClassSheddable}}})
	if err != nil {
		t.Fatal(err)
	}
	for path, class := range map[string]string{"/v1/analytics/x": sluice.ClassSheddable, "/V1/analytics/x": sluice.ClassDefault} {
		var req sluice.Request
		id.Identify("GET", path, nil, &req)
		if req.Class != class {
			t.Errorf("%s: %q, want %q", path, req.Class, class)
		}
	}
	if _, err := ParsePathMatch("loose"); err == nil {
		t.Fatal("an unknown path match parsed")
	}
}

// Matching a clean path allocates nothing.
func TestMatchDoesNotAllocate(t *testing.T) {
	id, _ := New(Rules{Routes: []Route{{Path: "/v1/analytics/*", Class: sluice.ClassSheddable}}})
	var req sluice.Request
	if n := testing.AllocsPerRun(100, func() { id.Identify("GET", "/V1/Analytics/x", nil, &req) }); n != 0 {
		t.Fatalf("%v allocations per match", n)
	}
}
