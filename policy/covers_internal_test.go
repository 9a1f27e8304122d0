package policy

import "testing"

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"/*", "/a", true}, {"/*", "/a/b", true}, {"/*", "/a/*", true}, {"/*", "/", false}, {"/*", "/*", true},
		{"/a", "/a", true}, {"/a", "/b", false}, {"/a", "/a/b", false}, {"/a/b", "/a", false},
		{"/a/*", "/a/b", true}, {"/a/*", "/a/b/c", true}, {"/a/*", "/a", false}, {"/a/*", "/b/c", false},
		{"/a/*/c", "/a/b/c", true}, {"/a/*/c", "/a/*/c", true}, {"/a/*/c", "/a/b/d", false},
		{"/a/*/c", "/a/*", false}, {"/a/b", "/a/*", false}, {"/a/*/c", "/a//c", false},
		{"/a/", "/a/", true}, {"/a", "/a/", false},
	} {
		if got := covers(c.a, c.b); got != c.want {
			t.Errorf("covers(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
