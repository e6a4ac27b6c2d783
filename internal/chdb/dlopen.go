//go:build !nochdb

package chdb

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// built says that this binary has the loader.
const built = true

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
	loadMu  sync.Mutex
	loaded  string // the library loaded, once loaded
	loadErr error
)

// load opens the library at path once per process; a later call with
// another path fails.
func load(path string) error {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != "" || loadErr != nil {
		if loadErr == nil && loaded != path {
			return fmt.Errorf("chdb: this process loaded %s already, not %s", loaded, path)
		}
		return loadErr
	}
	loadErr = dlopen(path)
	if loadErr == nil {
		loaded = path
	}
	return loadErr
}

func dlopen(path string) error {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return fmt.Errorf("load the ClickHouse engine %s: %w\n%s", path, err, HowToGet)
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
			return fmt.Errorf("%s lacks %s: not chDB's engine library, or a release older than 3.x\n%s", path, name, HowToGet)
		}
		purego.RegisterLibFunc(fn, h, name)
	}
	// The Go runtime handles SIGSEGV, SIGURG (preemption) and the rest;
	// chDB must not replace its handlers.
	lib.setSignalHandlersEnabled(0)
	return nil
}

// conn is a chdb_connection.
type conn struct {
	c      unsafe.Pointer // chdb_connection *
	handle unsafe.Pointer // chdb_connection: what queries take
}

func connect(dir string) (*conn, error) {
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
	c := lib.connect(int32(len(cargs)), &cargs[0])
	if c == nil || *(*unsafe.Pointer)(c) == nil {
		return nil, fmt.Errorf("chdb: start the engine on %s failed", dir)
	}
	return &conn{c: c, handle: *(*unsafe.Pointer)(c)}, nil
}

func (c *conn) query(sql []byte, format string) ([]byte, error) {
	f := []byte(format)
	res := lib.queryN(c.handle, &sql[0], uintptr(len(sql)), &f[0], uintptr(len(f)))
	runtime.KeepAlive(sql)
	runtime.KeepAlive(f)
	if res == nil {
		return nil, errors.New("chdb: chdb_query_n returned no result")
	}
	defer lib.destroyResult(res)
	if msg := lib.resultError(res); msg != "" {
		return nil, errors.New(strings.TrimSpace(msg))
	}
	n := int(lib.resultLength(res))
	buf := lib.resultBuffer(res)
	if n == 0 || buf == nil {
		return nil, nil
	}
	return append([]byte(nil), unsafe.Slice(buf, n)...), nil
}

// close closes the connection: closing the last one stops the engine
// (chdb_shutdown, which would also join its threads, answered CHDBError
// after a clean close).
func (c *conn) close() { lib.closeConn(c.c) }
