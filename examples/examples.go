// Package examples holds the example policy files of this directory,
// embedded so that the sluice command runs them from any directory.
//
//	data, file, ok := examples.ByName("routes-api") // examples/routes-api.yaml
package examples

import (
	"embed"
	"io/fs"
	"strings"
)

//go:embed *.yaml
var files embed.FS

// ByName returns the example policy named name (its file name without
// .yaml, e.g. "routes-api") and its file name.
func ByName(name string) (data []byte, file string, ok bool) {
	file = name + ".yaml"
	data, err := files.ReadFile(file)
	if err != nil || strings.ContainsAny(name, "/.") {
		return nil, "", false
	}
	return data, file, true
}

// Names lists the example policies, in file name order.
func Names() []string {
	entries, _ := fs.ReadDir(files, ".")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return names
}
