// Package chdb runs ClickHouse inside this process: chDB's engine
// (ClickHouse as a shared library, libchdb.so), found and loaded at run
// time with dlopen (purego, no cgo), on a data directory of its own. The
// report from audit log files (`auditsink report FILE...`) runs the very
// statements of analytics/sql on it, and the tests prove every statement
// on it (test/chdbtest).
//
// A process holds at most one engine, and must close it before it exits:
// a process that exits with the engine open crashes at teardown.
// Statements run one at a time.
//
// A binary built with the tag nochdb (the container images, which hold a
// static binary and nothing else) has no loader: Open says so.
package chdb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// LibEnv names the environment variable that points at libchdb.so.
const LibEnv = "CHDB_LIB_PATH"

// Tested is the chDB release the product's SQL is proven on, and
// NPMPackage the npm package that serves its library for Linux on x86-64.
const (
	Tested     = "26.7.3-stable.1"
	NPMPackage = "@chdb/lib-linux-x64-gnu"
)

// BundleDir is the directory, beside the executable, that `make chdb`
// unpacks the tested release into (bin/chdb-26.7.3, beside `make build`'s
// bin/auditsink).
const BundleDir = "chdb-26.7.3"

// SearchPath lists where Find looks for the library when neither a path
// nor LibEnv names one: next to the executable and in its BundleDir,
// where chDB's installer (https://lib.chdb.io) puts it, and the system's
// library directories.
func SearchPath() []string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe), filepath.Join(filepath.Dir(exe), BundleDir))
	}
	dirs = append(dirs, "/usr/local/lib", "/usr/lib", "/usr/lib64")
	paths := make([]string, len(dirs))
	for i, d := range dirs {
		paths[i] = filepath.Join(d, "libchdb.so")
	}
	return paths
}

// Find returns the library to load: path when given (a file, or a
// directory holding libchdb.so), else LibEnv's value
// when set, else the first of SearchPath that exists. The error says
// where it looked and how to get the library.
func Find(path string) (string, error) {
	if !built {
		return "", errNotBuilt
	}
	from := ""
	switch {
	case path != "":
		from = "given"
	case os.Getenv(LibEnv) != "":
		path, from = os.Getenv(LibEnv), "$"+LibEnv
	}
	if path != "" {
		fi, err := os.Stat(path)
		if err == nil && fi.IsDir() {
			path = filepath.Join(path, "libchdb.so")
			_, err = os.Stat(path)
		}
		if err != nil {
			return "", fmt.Errorf("ClickHouse engine library (%s): %w\n%s", from, err, HowToGet)
		}
		return path, nil
	}
	tried := SearchPath()
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no ClickHouse engine library (libchdb.so) in %s, and $%s is not set\n%s", strings.Join(tried, ", "), LibEnv, HowToGet)
}

// errNotBuilt is what Find and Open answer in a binary built without the
// loader.
var errNotBuilt = errors.New("this binary was built without the ClickHouse engine loader (tag nochdb, as the container images are, since they hold a static binary and no C library): " +
	"run the report from files with an auditsink built by `go build` or `go install` on a machine with glibc")

// HowToGet tells how to get the library.
var HowToGet = `The report from files runs on chDB's engine, ClickHouse as a library (566 MB). Get the release stampguard is tested with from npm:
    npm pack ` + NPMPackage + `@` + Tested + ` && tar -xzf chdb-lib-linux-x64-gnu-` + Tested + `.tgz package/libchdb.so
then set $` + LibEnv + ` to package/libchdb.so, or install chDB's current release into /usr/local/lib with
    curl -sL https://lib.chdb.io | bash
In a checkout of stampguard, ` + "`make build chdb`" + ` builds bin/auditsink and fetches the library into bin/` + BundleDir + `/, where bin/auditsink finds it. Without it, store the log in a ClickHouse server (auditsink ingest) and report from there.`

// Engine is the ClickHouse engine of this process.
type Engine struct {
	mu   sync.Mutex
	conn *conn // nil once closed
	dir  string
}

var (
	openMu sync.Mutex
	open   *Engine // the engine of this process, while open
)

// ErrOpen says that the process already holds an engine.
var ErrOpen = errors.New("chdb: this process already runs a ClickHouse engine; close it first")

// Open loads the library at lib (once per process) and starts the engine
// on the data directory dir, which must exist; what the engine stored
// there before is kept.
func Open(lib, dir string) (*Engine, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if open != nil {
		return nil, ErrOpen
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("chdb: data directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("chdb: data directory %s is not a directory", dir)
	}
	if err := load(lib); err != nil {
		return nil, err
	}
	c, err := connect(dir)
	if err != nil {
		return nil, err
	}
	open = &Engine{conn: c, dir: dir}
	return open, nil
}

// Dir is the engine's data directory.
func (e *Engine) Dir() string { return e.dir }

// Query runs one statement and returns its output in format
// (TabSeparated when empty). Statements with inline data (INSERT ...
// FORMAT f, then the data) work as in clickhouse-client: the data may be
// binary.
func (e *Engine) Query(sql []byte, format string) ([]byte, error) {
	if format == "" {
		format = "TabSeparated"
	}
	if len(sql) == 0 {
		return nil, errors.New("chdb: empty statement")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn == nil {
		return nil, errors.New("chdb: the engine is closed")
	}
	return e.conn.query(sql, format)
}

// Close stops the engine. The data directory stays.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn == nil {
		return nil
	}
	e.conn.close()
	e.conn = nil
	openMu.Lock()
	open = nil
	openMu.Unlock()
	return nil
}
