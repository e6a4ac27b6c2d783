// Package bintest builds the project's commands with `go build`, so that
// tests run the very processes users start rather than only their Go API.
// Each command is built once per test binary run, into a temporary
// directory of its own (never bin/, which all worktrees share), and reused
// by every test in the package.
package bintest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
)

var (
	mu     sync.Mutex
	dir    string
	builds = map[string]*build{}
)

type build struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the main package pkg, given relative to the module root
// (e.g. "./cmd/webhook"), and returns the binary's path. The first call in a
// test binary run builds it; later calls, from any test, return the same
// file. A build failure fails the test with the compiler's output. Call
// RemoveAll from TestMain to delete the binaries at the end of the run.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	testenv.SkipIfShort(t, "builds a command and runs it as a process")
	root := kubetest.RepoRoot(t)
	mu.Lock()
	if dir == "" {
		d, err := os.MkdirTemp("", "stampguard-bintest-")
		if err != nil {
			mu.Unlock()
			t.Fatalf("temporary directory for binaries: %v", err)
		}
		dir = d
	}
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	out := dir
	mu.Unlock()

	b.once.Do(func() {
		b.path = filepath.Join(out, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.Bytes())
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// RemoveAll deletes every binary Build made in this run.
func RemoveAll() error {
	mu.Lock()
	defer mu.Unlock()
	if dir == "" {
		return nil
	}
	err := os.RemoveAll(dir)
	dir, builds = "", map[string]*build{}
	return err
}

// ExitCode is the exit status of a finished command: 0 for a nil error,
// -1 when err is not an exit (the command could not start, or a signal
// killed it).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}
