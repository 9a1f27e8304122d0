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
