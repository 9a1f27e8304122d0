// Package buildinfo tells which sluice is running: the module version, the
// VCS revision and whether the tree had uncommitted changes, as the Go
// toolchain recorded them in the binary (runtime/debug.ReadBuildInfo), for
// `sluice version` and the sluice_build_info metric of every admin
// listener.
//
//	fmt.Println("sluice", buildinfo.Read()) // sluice v0.0.0-2026…-fce5e4f4b924 (fce5e4f4b924, go1.26.8)
//	reg.MustRegister(buildinfo.Collector())
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Module is the library's module path; a program that embeds sluice reports
// the version of this module it was built with.
const Module = "github.com/sluice-go/sluice"

// Devel is the version of a build with no module version: `go run`, or a
// build outside a VCS checkout.
const Devel = "(devel)"

// Info is what a binary knows of its own build.
type Info struct {
	// Version is the sluice module's version: a release tag, a
	// pseudo-version the toolchain derived from the VCS (with +dirty for
	// uncommitted changes), or Devel.
	Version string
	// Revision is the VCS commit the binary was built from, "" when the
	// build recorded none (-buildvcs=false, no checkout, go run, tests).
	Revision string
	// Time is the commit's time (RFC 3339), "" when unknown.
	Time string
	// Dirty reports uncommitted changes in the tree at build time.
	Dirty bool
	// GoVersion is the toolchain that built the binary, e.g. "go1.26.8".
	GoVersion string
}

// Read returns the running binary's build information. It never fails: a
// binary without build information reads as Devel and the runtime's Go
// version.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: Devel, GoVersion: runtime.Version()}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts Info from bi. The version is the main module's when
// the main module is sluice's (the library or its tools' module), and
// otherwise that of the sluice module among the dependencies (a program
// that embeds the library).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: moduleVersion(bi), GoVersion: bi.GoVersion}
	if in.GoVersion == "" {
		in.GoVersion = runtime.Version()
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Dirty = s.Value == "true"
		}
	}
	if in.Dirty && in.Version != Devel && !strings.HasSuffix(in.Version, "+dirty") {
		in.Version += "+dirty"
	}
	return in
}

func moduleVersion(bi *debug.BuildInfo) string {
	v := ""
	if bi.Main.Path == Module || strings.HasPrefix(bi.Main.Path, Module+"/") {
		v = bi.Main.Version
	} else {
		for _, d := range bi.Deps {
			if d.Path == Module {
				v = d.Version
				if d.Replace != nil && d.Replace.Version != "" {
					v = d.Replace.Version
				}
				break
			}
		}
	}
	if v == "" {
		return Devel
	}
	return v
}

// String is the version, then in parentheses the short revision (12
// digits), "modified" for a dirty tree, and the Go version:
// "v1.2.0 (fce5e4f4b924, go1.26.8)", "(devel) (go1.26.8)".
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Version)
	b.WriteString(" (")
	if in.Revision != "" {
		b.WriteString(in.Revision[:min(12, len(in.Revision))])
		if in.Dirty {
			b.WriteString(", modified")
		}
		b.WriteString(", ")
	}
	b.WriteString(in.GoVersion)
	b.WriteString(")")
	return b.String()
}

// Collector returns the gauge sluice_build_info{version,revision,goversion},
// always 1, for the running binary (the pattern of prometheus_build_info:
// join on it to label other series with the version).
func Collector() prometheus.Collector { return Read().Collector() }

// Collector returns the sluice_build_info gauge for in.
func (in Info) Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "The running sluice build: module version (with +dirty for uncommitted changes), VCS revision, Go version; always 1.",
		ConstLabels: prometheus.Labels{
			"version": in.Version, "revision": in.Revision, "goversion": in.GoVersion,
		},
	})
	g.Set(1)
	return g
}
