package store

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

// settingsFor are the connection settings the store sends to a server of
// version v; clickhouse-go attaches them to every query.
//
// 18.x (checked on 18.16) creates LowCardinality columns only with
// allow_experimental_low_cardinality_type = 1, and its LowCardinality
// blocks are read as plain String blocks (low_cardinality_allow_in_native_format
// = 0), which every driver version decodes. Later releases made
// LowCardinality a regular type, and current ones refuse the first
// setting: 26.7 answers `Code: 115 ... Unknown setting`. 26.7 still knows
// the second (default 1: LowCardinality in Native blocks, which the driver
// decodes), so nothing needs sending there.
func settingsFor(v proto.Version) clickhouse.Settings {
	if v.Major < 19 {
		return clickhouse.Settings{
			"allow_experimental_low_cardinality_type": 1,
			"low_cardinality_allow_in_native_format":  0,
		}
	}
	return nil
}

// serverConn is a connection pool whose settings suit its server. The
// first call that reaches the server reads its version from the handshake;
// when settingsFor asks for settings, the pool is reopened with them. Until
// then nothing dials: a sink starts while ClickHouse is away.
type serverConn struct {
	opts *clickhouse.Options

	mu    sync.Mutex
	conn  driver.Conn
	ready bool // conn has the settings of its server
}

var _ driver.Conn = (*serverConn)(nil)

func openServerConn(opts *clickhouse.Options) (*serverConn, error) {
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, err
	}
	return &serverConn{opts: opts, conn: conn}, nil
}

// get returns the pool, learning the server's version first if need be.
// A failure is not remembered: the next call tries again.
func (c *serverConn) get() (driver.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ready {
		return c.conn, nil
	}
	sv, err := c.conn.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("ClickHouse server version: %w", err)
	}
	if extra := settingsFor(sv.Version); len(extra) > 0 {
		opts := *c.opts
		opts.Settings = clickhouse.Settings{}
		for k, v := range c.opts.Settings {
			opts.Settings[k] = v
		}
		for k, v := range extra {
			opts.Settings[k] = v
		}
		conn, err := clickhouse.Open(&opts)
		if err != nil {
			return nil, fmt.Errorf("reopen ClickHouse with the settings of %s %s: %w", sv.Name, sv.Version, err)
		}
		_ = c.conn.Close()
		c.conn = conn
	}
	c.ready = true
	return c.conn, nil
}

func (c *serverConn) Contributors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Contributors()
}

func (c *serverConn) ServerVersion() (*driver.ServerVersion, error) {
	conn, err := c.get()
	if err != nil {
		return nil, err
	}
	return conn.ServerVersion()
}

func (c *serverConn) Select(ctx context.Context, dest any, query string, args ...any) error {
	conn, err := c.get()
	if err != nil {
		return err
	}
	return conn.Select(ctx, dest, query, args...)
}

func (c *serverConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	conn, err := c.get()
	if err != nil {
		return nil, err
	}
	return conn.Query(ctx, query, args...)
}

func (c *serverConn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	conn, err := c.get()
	if err != nil {
		return errRow{err}
	}
	return conn.QueryRow(ctx, query, args...)
}

func (c *serverConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	conn, err := c.get()
	if err != nil {
		return nil, err
	}
	return conn.PrepareBatch(ctx, query, opts...)
}

func (c *serverConn) Exec(ctx context.Context, query string, args ...any) error {
	conn, err := c.get()
	if err != nil {
		return err
	}
	return conn.Exec(ctx, query, args...)
}

func (c *serverConn) QueryFormat(ctx context.Context, format string, query string, args ...any) (io.ReadCloser, error) {
	conn, err := c.get()
	if err != nil {
		return nil, err
	}
	return conn.QueryFormat(ctx, format, query, args...)
}

func (c *serverConn) InsertFormat(ctx context.Context, format string, query string, data io.Reader) error {
	conn, err := c.get()
	if err != nil {
		return err
	}
	return conn.InsertFormat(ctx, format, query, data)
}

//nolint:staticcheck // part of driver.Conn
func (c *serverConn) AsyncInsert(ctx context.Context, query string, wait bool, args ...any) error {
	conn, err := c.get()
	if err != nil {
		return err
	}
	return conn.AsyncInsert(ctx, query, wait, args...)
}

func (c *serverConn) Ping(ctx context.Context) error {
	conn, err := c.get()
	if err != nil {
		return err
	}
	return conn.Ping(ctx)
}

func (c *serverConn) Stats() driver.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Stats()
}

func (c *serverConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Close()
}

// errRow is a QueryRow answer that never reached the server.
type errRow struct{ err error }

func (r errRow) Err() error           { return r.err }
func (r errRow) Scan(...any) error    { return r.err }
func (r errRow) ScanStruct(any) error { return r.err }
