// Package dashboards generates stampguard's Grafana dashboards and alert
// rules with grafana-foundation-sdk, from the analytics statements of
// analytics/sql rendered for the Grafana ClickHouse data source.
//
// The generated files live in generated/ (OutputDir): one <uid>.json per
// dashboard and alert-rules.yaml, a Grafana alert provisioning file.
// Regenerate them with `go generate ./dashboards` or `make generate`.
package dashboards

// OutputDir is where `go generate` writes the files, relative to this
// package. The generator takes -out more than once to write a second copy
// (for instance into a Helm chart).
const OutputDir = "generated"

//go:generate go run ./gen -out generated
