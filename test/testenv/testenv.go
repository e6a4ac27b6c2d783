// Package testenv decides whether a test that starts real components
// (kube-apiserver, etcd, clickhouse-server, child processes) runs.
package testenv

import (
	"os"
	"testing"
)

// SkipIfShort skips such a test under `go test -short` (make test-unit) on a
// developer's machine. Under CI=true it refuses to skip: a CI run that
// quietly left out the real components would pass without proving anything.
func SkipIfShort(tb testing.TB, starts string) {
	tb.Helper()
	if !testing.Short() {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("this test %s and must run under CI=true; do not pass -short there", starts)
	}
	tb.Skipf("%s; not in -short mode", starts)
}
