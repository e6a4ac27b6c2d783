package store

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"github.com/stampguard/stampguard/analytics/record"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/audit"
)

// Options configure a Store.
type Options struct {
	// DSN is a clickhouse-go native DSN (clickhouse://user:pass@host:9000?secure=true).
	// Credentials and TLS come from it.
	DSN string
	// Database holds the tables; defaulted to "stampguard" if empty.
	Database string
	// KeepRaw stores each event's (redacted) raw JSON in events.raw.
	KeepRaw bool
	// ClickHouseCluster, when set, names a cluster of the servers'
	// remote_servers: the schema is then created ON CLUSTER as replicated
	// local tables behind Distributed tables (cluster.go). Empty: one node.
	ClickHouseCluster string
}

// Store writes rows to ClickHouse and keeps the hour caches (Compact).
// Exactness is a property of the schema, not of the writers: every read
// takes each event once by its identity, however often it was inserted
// (docs/auditsink.md, "Exactly once").
type Store struct {
	conn driver.Conn
	db   string
	raw  bool
	// events is the table inserts go to: asql.EventsTable, or (for a test
	// that plays a sink of an older version) asql.LegacyEventsTable.
	events string
	// noHistories stores no field histories, as sinks before migration 10
	// did (set by tests that play one).
	noHistories bool
	// ddl renders DDL for a cluster; nil on a single node.
	ddl *clusterDDL
	// hook, when set (by tests of this package), runs at each step of a
	// compaction, so that a test can let another writer act there.
	hook func(step string)
}

// Open connects to ClickHouse. It does not create the schema; call
// Migrate.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.Database == "" {
		o.Database = "stampguard"
	}
	opts, ddl, err := o.resolve()
	if err != nil {
		return nil, err
	}
	// The settings a server needs depend on its version (settingsFor),
	// which the first query that reaches it reads from the handshake.
	conn, err := openServerConn(opts)
	if err != nil {
		return nil, fmt.Errorf("open ClickHouse: %w", err)
	}
	return &Store{conn: conn, db: o.Database, raw: o.KeepRaw, ddl: ddl, events: asql.EventsTable}, nil
}

// Check validates o as Open does, without connecting: the database name,
// the DSN (the native protocol) and the ClickHouse cluster name.
func (o Options) Check() error {
	if o.Database == "" {
		o.Database = "stampguard"
	}
	_, _, err := o.resolve()
	return err
}

// resolve validates o and turns it into the driver's options, with what
// sharded mode needs when o names a ClickHouse cluster.
func (o Options) resolve() (*clickhouse.Options, *clusterDDL, error) {
	if err := asql.ValidDatabase(o.Database); err != nil {
		return nil, nil, err
	}
	opts, err := ParseDSN(o.DSN)
	if err != nil {
		return nil, nil, err
	}
	if opts.Protocol == clickhouse.HTTP {
		return nil, nil, fmt.Errorf("ClickHouse DSN: use the native protocol (clickhouse://host:9000); 18.16 rejects the HTTP driver")
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 5 * time.Second
	}
	var ddl *clusterDDL
	if o.ClickHouseCluster != "" {
		if ddl, err = newClusterDDL(o.ClickHouseCluster); err != nil {
			return nil, nil, err
		}
		ddl.applySettings(opts)
	}
	return opts, ddl, nil
}

// ParseDSN parses a clickhouse-go DSN, plus one parameter of ours:
// ca_file=/path/ca.pem, the CA bundle that verifies the server with
// secure=true. Errors never echo the DSN, which may hold a password.
func ParseDSN(dsn string) (*clickhouse.Options, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, errors.New("parse ClickHouse DSN: not a URL")
	}
	q := u.Query()
	caFile := q.Get("ca_file")
	q.Del("ca_file")
	u.RawQuery = q.Encode()
	opts, err := clickhouse.ParseDSN(u.String())
	if err != nil {
		return nil, fmt.Errorf("parse ClickHouse DSN: %w", err)
	}
	if caFile != "" {
		if opts.TLS == nil {
			return nil, errors.New("ClickHouse DSN: ca_file needs secure=true")
		}
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("ClickHouse DSN ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ClickHouse DSN ca_file %s holds no PEM certificates", caFile)
		}
		opts.TLS.RootCAs = pool
	}
	return opts, nil
}

// Close closes the connections.
func (s *Store) Close() error { return s.conn.Close() }

// Conn exposes the connection for queries (issue 4's analytics).
func (s *Store) Conn() driver.Conn { return s.conn }

// Database is the database the store writes to.
func (s *Store) Database() string { return s.db }

// InsertResult counts what InsertRecords did.
type InsertResult struct {
	Stored     int // rows inserted into events
	Duplicates int // rows dropped: repeated in the batch
	Dead       int // dead letters inserted
}

// InsertRecords stores the rows and dead letters of a record set, each
// row once (a row repeated in the set is sent once). It does not change
// the set, so a failed call can be repeated with it.
//
// There is no lookup before the insert and no check after it: a copy of an
// event (a redelivery, a racing writer, a retry of an insert that was
// applied in part) is a second row with the same identity in events, which
// every read deduplicates, and the insert's hour marks make any cache of
// those hours stale until it is rebuilt from the deduplicated events.
func (s *Store) InsertRecords(ctx context.Context, set *record.Set) (InsertResult, error) {
	var res InsertResult
	events := set.Events()
	res.Duplicates = set.Rows() - events.Len()
	if events.Len() > 0 {
		// The histories first: an event stored means its history is.
		if !s.noHistories {
			if err := s.insertHistories(ctx, events); err != nil {
				return res, err
			}
		}
		if err := s.insertEvents(ctx, events); err != nil {
			return res, err
		}
	}
	res.Stored = events.Len()
	if dead := set.Dead(); len(dead) > 0 {
		if err := s.insertDead(ctx, dead); err != nil {
			return res, err
		}
		res.Dead = len(dead)
	}
	return res, nil
}

// insertBlockRows is the most rows the sink encodes into one native block.
// An insert of more rows sends several blocks in one INSERT, which the
// server squashes into one part per partition (up to
// min_insert_block_size_rows, 1,048,576 by default), so the sink's memory
// stays bounded while ClickHouse still writes few, large parts: on this
// project's test machines creating a part's files costs more server CPU
// than the rows in it.
const insertBlockRows = 8 << 10

// insertEvents sends the rows in the table's order (Set.Events): the
// server then skips sorting the block (for 18.16 on a 2-core machine a
// third of its insert CPU).
func (s *Store) insertEvents(ctx context.Context, events record.Events) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+"."+s.events+" ("+record.EventColumns+")")
	if err != nil {
		return fmt.Errorf("prepare events insert: %w", err)
	}
	defer func() { _ = b.Abort() }() // after Send: a no-op that reports "already sent"
	if err := events.Load(b.Columns, s.raw, insertBlockRows, func() error {
		if err := b.Flush(); err != nil {
			return fmt.Errorf("insert events: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert events: %w", err)
	}
	return nil
}

func (s *Store) insertDead(ctx context.Context, dead []audit.DeadLetter) error {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+
		".dead_letters (received_date, received_at, received_us, cluster, source, reason, raw, raw_hash)")
	if err != nil {
		return fmt.Errorf("prepare dead letter insert: %w", err)
	}
	defer func() { _ = b.Abort() }()
	for _, d := range dead {
		t := time.UnixMicro(d.ReceivedAt).UTC()
		day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		if err := b.Append(day, t.Truncate(time.Second), uint64(d.ReceivedAt), d.Cluster, d.Source,
			d.Reason, d.Raw, d.RawHash()); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert dead letters: %w", err)
	}
	return nil
}

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
