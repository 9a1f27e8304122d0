package redistest

import (
	"strings"
	"testing"
)

func TestStandaloneLifecycle(t *testing.T) {
	s := Start(t)
	if got := s.Do("set", "k", "1"); got != "OK" {
		t.Fatal(got)
	}
	s.Restart()
	if got := s.Do("get", "k"); got != "" {
		t.Fatalf("restart kept state: %q", got)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	if got := c.Nodes[0].Do("cluster", "info"); !strings.Contains(got, "cluster_known_nodes:3") {
		t.Fatal(got)
	}
}
