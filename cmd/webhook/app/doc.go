// Package app is the webhook binary's wiring: the options of each of its
// commands (serve, configurations, replay) with their flags and
// defaults, and what runs them.
package app
