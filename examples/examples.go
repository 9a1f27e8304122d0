// Package examples holds the example policy files, embedded so that
// `sluice demo` runs from any directory.
package examples

import _ "embed"

// RoutesAPI is examples/routes-api.yaml.
//
//go:embed routes-api.yaml
var RoutesAPI []byte

// Mercury is examples/mercury.yaml.
//
//go:embed mercury.yaml
var Mercury []byte

// RoutesAPIShedding is examples/routes-api-shedding.yaml.
//
//go:embed routes-api-shedding.yaml
var RoutesAPIShedding []byte

// ByName returns the example policy named name ("routes-api", "mercury",
// "routes-api-shedding") and its file name.
func ByName(name string) (data []byte, file string, ok bool) {
	switch name {
	case "routes-api":
		return RoutesAPI, "routes-api.yaml", true
	case "mercury":
		return Mercury, "mercury.yaml", true
	case "routes-api-shedding":
		return RoutesAPIShedding, "routes-api-shedding.yaml", true
	}
	return nil, "", false
}
