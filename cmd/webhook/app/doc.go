// Package app is the webhook binary behind cmd/webhook's thin main: the
// options of each command with their flags and Default* constants
// (options.go for serving, configurations.go, replay.go), and what runs
// them. Run wires the admission server, the ConcurrencyPolicy informer,
// the configuration sync and the probes, and can be started inside tests.
package app
