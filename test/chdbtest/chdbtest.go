// Package chdbtest runs SQL on a current ClickHouse (26.7) for tests: the
// product's engine (internal/chdb, chDB's library loaded at run time),
// booted once per test binary on a data directory of its own. `make chdb`
// fetches the library into bin/.
//
// chDB has no network server, so only SQL can be proven here, not the
// native protocol. The engine boots in about a second and takes 200-270
// MiB; each test works in a database of its own (NewDatabase). A test
// binary that opens it must run its tests through Main, which closes the
// engine before the process exits: a process that exits with the engine
// open crashes at teardown.
package chdbtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stampguard/stampguard/internal/chdb"
)

// LibEnv names the environment variable that points at libchdb.so; the
// Makefile sets it. Unset, the library is looked up in the module's
// bin/chdb-26.7.3.
const LibEnv = chdb.LibEnv

// libDir is where `make chdb` unpacks the library, under the module root.
const libDir = "bin/" + chdb.BundleDir

// Engine is the ClickHouse engine of this process.
type Engine struct {
	*chdb.Engine
}

var (
	mainRunning bool // set by Main: someone closes the engine at exit
	once        sync.Once
	engine      *Engine
	loadErr     error
)

// Main runs the tests of a package that uses the engine, closes the
// engine and exits. Call it from TestMain:
//
//	func TestMain(m *testing.M) { chdbtest.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that has more to do after the tests: it runs
// them, closes the engine and removes its data directory, and returns the
// exit code.
func Run(m *testing.M) int {
	mainRunning = true
	code := m.Run()
	if err := closeEngine(); err != nil {
		fmt.Fprintln(os.Stderr, "chdbtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Open returns the engine, booting it on first use. A missing library
// fails the test with the make target that fetches it.
func Open(tb testing.TB) *Engine {
	tb.Helper()
	if !mainRunning {
		tb.Fatal("chdbtest: the test binary must close the engine before it exits: call chdbtest.Main(m) from TestMain")
	}
	once.Do(func() { engine, loadErr = boot(LibPath()) })
	if loadErr != nil {
		tb.Fatalf("chdbtest: %v", loadErr)
	}
	return engine
}

// LibPath is the library the tests load: $CHDB_LIB_PATH, or the one
// `make chdb` fetched into the module's bin/.
func LibPath() string {
	if p := os.Getenv(LibEnv); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0) // test/chdbtest/chdbtest.go
	return filepath.Join(filepath.Dir(file), "..", "..", libDir, "libchdb.so")
}

func boot(path string) (*Engine, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("ClickHouse 26.7 library not found (%w): run `make chdb` (or `make test`), which fetches it from the npm registry", err)
	}
	dir, err := os.MkdirTemp("", "chdbtest-")
	if err != nil {
		return nil, err
	}
	e, err := chdb.Open(path, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Engine{e}, nil
}

func closeEngine() error {
	if engine == nil {
		return nil
	}
	if err := engine.Close(); err != nil {
		return err
	}
	return os.RemoveAll(engine.Dir())
}

// Query runs one statement and returns its output in format (TabSeparated
// when empty). Statements with inline data (INSERT ... FORMAT f <rows>)
// work as in clickhouse-client.
func (e *Engine) Query(sql, format string) (string, error) {
	out, err := e.Engine.Query([]byte(sql), format)
	return string(out), err
}

// Exec runs statements in order and fails the test at the first error.
func (e *Engine) Exec(tb testing.TB, sqls ...string) {
	tb.Helper()
	for _, q := range sqls {
		if _, err := e.Query(q, ""); err != nil {
			tb.Fatalf("ClickHouse 26.7: %v\nin:\n%s", err, short(q))
		}
	}
}

// NewDatabase creates a database with a fresh random name and drops it at
// test cleanup.
func (e *Engine) NewDatabase(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	e.Exec(tb, "CREATE DATABASE "+name)
	tb.Cleanup(func() { _, _ = e.Query("DROP DATABASE IF EXISTS "+name+" SYNC", "") })
	return name
}

func short(q string) string {
	if len(q) > 2000 {
		return q[:2000] + " ..."
	}
	return q
}
