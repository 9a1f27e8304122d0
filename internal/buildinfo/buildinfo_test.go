package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func vcs(rev, modified string) []debug.BuildSetting {
	return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
		{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: modified}}
}

const rev = "fce5e4f4b924eb56ddc3fb3915a6fd0af33c3801"

func TestFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
		str  string
	}{
		{"tagged tools build", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module + "/cmd", Version: "v1.2.0"}, Settings: vcs(rev, "false")},
			Info{Version: "v1.2.0", Revision: rev, Time: "2026-12-01T10:00:00Z", GoVersion: "go1.26.8"}, "v1.2.0 (fce5e4f4b924, go1.26.8)"},
		{"pseudo-version already dirty", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module + "/cmd", Version: "v0.0.0-20261201100000-fce5e4f4b924+dirty"}, Settings: vcs(rev, "true")},
			Info{Version: "v0.0.0-20261201100000-fce5e4f4b924+dirty", Revision: rev, Time: "2026-12-01T10:00:00Z", Dirty: true, GoVersion: "go1.26.8"},
			"v0.0.0-20261201100000-fce5e4f4b924+dirty (fce5e4f4b924, modified, go1.26.8)"},
		{"tag on a dirty tree", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module, Version: "v1.2.0"}, Settings: vcs(rev, "true")},
			Info{Version: "v1.2.0+dirty", Revision: rev, Time: "2026-12-01T10:00:00Z", Dirty: true, GoVersion: "go1.26.8"}, "v1.2.0+dirty (fce5e4f4b924, modified, go1.26.8)"},
		{"go run: devel, no vcs", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module + "/cmd", Version: "(devel)"}},
			Info{Version: Devel, GoVersion: "go1.26.8"}, "(devel) (go1.26.8)"},
		{"embedded in another program", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app", Version: "v3.0.0"},
			Deps: []*debug.Module{{Path: "github.com/other/x", Version: "v9.9.9"}, {Path: Module, Version: "v1.1.0"}}, Settings: vcs(rev, "false")},
			Info{Version: "v1.1.0", Revision: rev, Time: "2026-12-01T10:00:00Z", GoVersion: "go1.26.8"}, "v1.1.0 (fce5e4f4b924, go1.26.8)"},
		{"embedded, replaced by a version", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: Module, Version: "v0.0.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v1.0.1"}}}},
			Info{Version: "v1.0.1", GoVersion: "go1.26.8"}, "v1.0.1 (go1.26.8)"},
		{"embedded, replaced by a directory", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: Module, Version: "v0.0.0", Replace: &debug.Module{Path: "../sluice"}}}},
			Info{Version: "v0.0.0", GoVersion: "go1.26.8"}, "v0.0.0 (go1.26.8)"},
		{"a look-alike module path is not sluice", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module + "-fork", Version: "v5.0.0"}},
			Info{Version: Devel, GoVersion: "go1.26.8"}, "(devel) (go1.26.8)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := FromBuildInfo(&c.bi)
			if got != c.want {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
			if s := got.String(); s != c.str {
				t.Fatalf("String() = %q, want %q", s, c.str)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	in := Info{Version: "v1.2.0", Revision: rev, GoVersion: "go1.26.8"}
	want := `# HELP sluice_build_info The running sluice build: module version (with +dirty for uncommitted changes), VCS revision, Go version; always 1.
# TYPE sluice_build_info gauge
sluice_build_info{goversion="go1.26.8",revision="` + rev + `",version="v1.2.0"} 1
`
	if err := testutil.CollectAndCompare(in.Collector(), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// The test binary itself reads as something, never empty labels for
	// version and goversion.
	if got := Read(); got.Version == "" || got.GoVersion == "" {
		t.Fatalf("Read() = %+v", got)
	}
}
