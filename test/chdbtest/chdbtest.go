// Package chdbtest runs SQL on a current ClickHouse (26.7) for tests: chDB's
// engine, ClickHouse as a shared library, loaded into the test process with
// dlopen (purego, no cgo). `make chdb` fetches the library into bin/.
//
// chDB has no network server, so only SQL can be proven here, not the
// native protocol. The engine boots once per test binary (about a second,
// 200-270 MiB) on a data directory of its own, and each test works in a
// database of its own (NewDatabase). A test binary that opens it must run
// its tests through Main, which closes the engine before the process
// exits: a process that exits with the engine open crashes at teardown.
//
// Only tests import this package; the product never loads chDB.
package chdbtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibEnv names the environment variable that points at libchdb.so; the
// Makefile sets it. Unset, the library is looked up in the module's
// bin/chdb-26.7.3.
const LibEnv = "CHDB_LIB_PATH"

// libDir is where `make chdb` unpacks the library, under the module root.
const libDir = "bin/chdb-26.7.3"

// Engine is the ClickHouse engine of this process. Queries run one at a
// time: a chDB connection runs one statement at a time.
type Engine struct {
	mu     sync.Mutex
	conn   unsafe.Pointer // chdb_connection *
	handle unsafe.Pointer // chdb_connection: what queries take
	dir    string
}

// The C API (chdb.h of chDB 26.7).
var lib struct {
	setSignalHandlersEnabled func(enabled int32)
	connect                  func(argc int32, argv **byte) unsafe.Pointer
	closeConn                func(conn unsafe.Pointer)
	queryN                   func(conn unsafe.Pointer, query *byte, queryLen uintptr, format *byte, formatLen uintptr) unsafe.Pointer
	resultError              func(res unsafe.Pointer) string
	resultBuffer             func(res unsafe.Pointer) *byte
	resultLength             func(res unsafe.Pointer) uintptr
	destroyResult            func(res unsafe.Pointer)
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
	once.Do(func() { engine, loadErr = load(libPath()) })
	if loadErr != nil {
		tb.Fatalf("chdbtest: %v", loadErr)
	}
	return engine
}

func libPath() string {
	if p := os.Getenv(LibEnv); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0) // test/chdbtest/chdbtest.go
	return filepath.Join(filepath.Dir(file), "..", "..", libDir, "libchdb.so")
}

func load(path string) (*Engine, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("ClickHouse 26.7 library not found (%w): run `make chdb` (or `make test`), which fetches it from the npm registry", err)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w (run `make chdb` to fetch it again)", path, err)
	}
	for name, fn := range map[string]any{
		"chdb_set_signal_handlers_enabled": &lib.setSignalHandlersEnabled,
		"chdb_connect":                     &lib.connect,
		"chdb_close_conn":                  &lib.closeConn,
		"chdb_query_n":                     &lib.queryN,
		"chdb_result_error":                &lib.resultError,
		"chdb_result_buffer":               &lib.resultBuffer,
		"chdb_result_length":               &lib.resultLength,
		"chdb_destroy_query_result":        &lib.destroyResult,
	} {
		if _, err := purego.Dlsym(h, name); err != nil {
			return nil, fmt.Errorf("%s lacks %s: not the chDB 26.7 library `make chdb` fetches", path, name)
		}
		purego.RegisterLibFunc(fn, h, name)
	}
	// The Go runtime handles SIGSEGV, SIGURG (preemption) and the rest;
	// chDB must not replace its handlers.
	lib.setSignalHandlersEnabled(0)

	dir, err := os.MkdirTemp("", "chdbtest-")
	if err != nil {
		return nil, err
	}
	args := []string{"clickhouse", "--path=" + dir}
	cargs := make([]*byte, len(args))
	var pin runtime.Pinner
	defer pin.Unpin()
	for i, a := range args {
		b := append([]byte(a), 0)
		pin.Pin(&b[0])
		cargs[i] = &b[0]
	}
	pin.Pin(&cargs[0])
	conn := lib.connect(int32(len(cargs)), &cargs[0])
	if conn == nil || *(*unsafe.Pointer)(conn) == nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("chdb_connect --path=%s failed", dir)
	}
	return &Engine{conn: conn, handle: *(*unsafe.Pointer)(conn), dir: dir}, nil
}

func closeEngine() error {
	if engine == nil {
		return nil
	}
	engine.mu.Lock()
	defer engine.mu.Unlock()
	lib.closeConn(engine.conn)
	engine.conn, engine.handle = nil, nil
	// Closing the last connection stops the engine (chdb_shutdown, which
	// would also join its threads, answered CHDBError after a clean close).
	return os.RemoveAll(engine.dir)
}

// Query runs one statement and returns its output in format (TabSeparated
// when empty). Statements with inline data (INSERT ... FORMAT f <rows>)
// work as in clickhouse-client.
func (e *Engine) Query(sql, format string) (string, error) {
	if format == "" {
		format = "TabSeparated"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.handle == nil {
		return "", errors.New("chdbtest: the engine is closed")
	}
	q, f := []byte(sql), []byte(format)
	if len(q) == 0 {
		return "", errors.New("chdbtest: empty statement")
	}
	res := lib.queryN(e.handle, &q[0], uintptr(len(q)), &f[0], uintptr(len(f)))
	runtime.KeepAlive(q)
	runtime.KeepAlive(f)
	if res == nil {
		return "", errors.New("chdbtest: chdb_query_n returned no result")
	}
	defer lib.destroyResult(res)
	if msg := lib.resultError(res); msg != "" {
		return "", errors.New(strings.TrimSpace(msg))
	}
	n := int(lib.resultLength(res))
	buf := lib.resultBuffer(res)
	if n == 0 || buf == nil {
		return "", nil
	}
	return string(unsafe.Slice(buf, n)), nil
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
