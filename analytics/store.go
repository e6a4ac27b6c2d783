package analytics

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// StoreOptions configure a Store.
type StoreOptions struct {
	// DSN is a clickhouse-go native DSN (clickhouse://user:pass@host:9000?secure=true).
	// Credentials and TLS come from it.
	DSN string
	// Database holds the tables; defaulted to "stampguard" if empty.
	Database string
	// KeepRaw stores each event's (redacted) raw JSON in events.raw.
	KeepRaw bool
}

// Store writes rows to ClickHouse exactly once: Insert drops the events
// that event_keys says are stored already.
type Store struct {
	conn driver.Conn
	db   string
	raw  bool
}

// OpenStore connects to ClickHouse. It does not create the schema; call
// Migrate.
func OpenStore(ctx context.Context, o StoreOptions) (*Store, error) {
	if o.Database == "" {
		o.Database = "stampguard"
	}
	if err := ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	opts, err := ParseDSN(o.DSN)
	if err != nil {
		return nil, err
	}
	if opts.Protocol == clickhouse.HTTP {
		return nil, fmt.Errorf("ClickHouse DSN: use the native protocol (clickhouse://host:9000); 18.16 rejects the HTTP driver")
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 5 * time.Second
	}
	// The settings a server needs depend on its version (settingsFor),
	// which the first query that reaches it reads from the handshake.
	conn, err := openServerConn(opts)
	if err != nil {
		return nil, fmt.Errorf("open ClickHouse: %w", err)
	}
	return &Store{conn: conn, db: o.Database, raw: o.KeepRaw}, nil
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

// Ping checks that ClickHouse answers.
func (s *Store) Ping(ctx context.Context) error { return s.conn.Ping(ctx) }

// Conn exposes the connection for queries (issue 4's analytics).
func (s *Store) Conn() driver.Conn { return s.conn }

// Database is the database the store writes to.
func (s *Store) Database() string { return s.db }

// InsertResult counts what Insert did.
type InsertResult struct {
	Stored     int // rows inserted into events
	Duplicates int // rows dropped: stored before, or repeated in the batch
	Dead       int // dead letters inserted
}

type eventKey struct {
	cluster, auditID, stage string
	fingerprint             uint64
}

// Insert stores rows and dead letters. Rows whose key (cluster, audit_id,
// stage, fingerprint) is already in event_keys, or repeated within rows,
// are dropped. Insert is idempotent: calling it again with the same input
// after an error or a crash stores nothing twice (event_keys is filled by
// a materialized view in the same INSERT as events).
//
// Insert encodes the rows as spool records and stores them with
// InsertRecords, the path the sink's writer takes.
func (s *Store) Insert(ctx context.Context, rows []Row, dead []DeadLetter) (InsertResult, error) {
	set, err := recordSetOf(rows, dead, s.raw)
	if err != nil {
		return InsertResult{}, err
	}
	return s.InsertRecords(ctx, set)
}

// InsertRecords stores the rows and dead letters of a record set exactly
// once, like Insert. It does not change the set, so a failed call can be
// repeated with it.
func (s *Store) InsertRecords(ctx context.Context, set *RecordSet) (InsertResult, error) {
	var res InsertResult
	fresh, err := s.fresh(ctx, set.rows)
	if err != nil {
		return res, err
	}
	res.Duplicates = len(set.rows) - len(fresh)
	if len(fresh) > 0 {
		if err := s.insertEvents(ctx, fresh); err != nil {
			return res, err
		}
	}
	res.Stored = len(fresh)
	if len(set.dead) > 0 {
		if err := s.insertDead(ctx, set.dead); err != nil {
			return res, err
		}
		res.Dead = len(set.dead)
	}
	return res, nil
}

// fresh returns the rows not yet stored, without in-batch repeats.
func (s *Store) fresh(ctx context.Context, rows []rowRef) ([]rowRef, error) {
	out, _ := dedup(rows, nil)
	if len(out) == 0 {
		return out, nil
	}
	stored := map[eventKey]struct{}{}
	for cluster, rs := range byCluster(out) {
		if err := s.lookup(ctx, cluster, rs, stored); err != nil {
			return nil, err
		}
	}
	if len(stored) == 0 {
		return out, nil
	}
	var kept []rowRef // not out[:0]: out may be the caller's rows
	for _, r := range out {
		if _, ok := stored[r.key]; !ok {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// byCluster splits rows by cluster (almost always one).
func byCluster(rows []rowRef) map[string][]rowRef {
	one := rows[0].key.cluster
	if !slices.ContainsFunc(rows, func(r rowRef) bool { return r.key.cluster != one }) {
		return map[string][]rowRef{one: rows}
	}
	m := map[string][]rowRef{}
	for _, r := range rows {
		m[r.key.cluster] = append(m[r.key.cluster], r)
	}
	return m
}

// lookup returns which of the rows' keys event_keys holds. The batch's keys
// travel as an external table of the native protocol (a data block, not a
// literal IN list the server would have to parse), and the days of the
// batch prune the partitions read.
func (s *Store) lookup(ctx context.Context, cluster string, rows []rowRef, stored map[eventKey]struct{}) error {
	keys, err := ext.NewTable("batch_keys", ext.Column("audit_id", "String"))
	if err != nil {
		return err
	}
	ids := make([]string, len(rows))
	days := map[int64]struct{}{}
	last := int64(math.MinInt64)
	for i := range rows {
		ids[i] = rows[i].key.auditID
		if d := floorDiv(rows[i].micros, 86_400_000_000); d != last {
			days[d], last = struct{}{}, d
		}
	}
	if _, err := keys.Block().Columns[0].Append(ids); err != nil {
		return err
	}
	dayList := make([]any, 0, len(days))
	for d := range days {
		dayList = append(dayList, time.Unix(d*86400, 0).UTC().Format(time.DateOnly))
	}
	q := "SELECT audit_id, toString(stage), fingerprint FROM " + s.db + ".event_keys" +
		" WHERE event_date IN ? AND cluster = ? AND audit_id IN (SELECT audit_id FROM batch_keys)"
	res, err := s.conn.Query(clickhouse.Context(ctx, clickhouse.WithExternalTable(keys)), q,
		clickhouse.GroupSet{Value: dayList}, cluster)
	if err != nil {
		return fmt.Errorf("look up stored event keys: %w", lookupError{err})
	}
	defer res.Close()
	for res.Next() {
		k := eventKey{cluster: cluster}
		if err := res.Scan(&k.auditID, &k.stage, &k.fingerprint); err != nil {
			return fmt.Errorf("scan event key: %w", err)
		}
		stored[k] = struct{}{}
	}
	return res.Err()
}

// EventColumns is the events insert column list, in the order insertEvents
// appends.
const EventColumns = `event_date, event_time, event_time_us, request_received_us, latency_us,
	cluster, audit_id, stage, fingerprint, level, verb, request_uri, dry_run,
	user, user_groups, impersonated_user, writer, user_agent, source_ip,
	api_group, api_version, resource, subresource, namespace, name, object_uid,
	stamp, field_manager, code, reason, message, cause_reasons, cause_fields,
	authz_decision, annotation_keys, annotation_values, lease_holder, raw`

// insertBlockRows is the most rows the sink encodes into one native block.
// An insert of more rows sends several blocks in one INSERT, which the
// server squashes into one part per partition (up to
// min_insert_block_size_rows, 1,048,576 by default), so the sink's memory
// stays bounded while ClickHouse still writes few, large parts: on this
// project's test machines creating a part's files costs more server CPU
// than the rows in it.
const insertBlockRows = 8 << 10

func (s *Store) insertEvents(ctx context.Context, rows []rowRef) error {
	// Send the rows in the table's order: the server then skips sorting
	// the block (for 18.16 on a 2-core machine a third of its insert CPU).
	order := eventOrder(rows)

	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".events ("+EventColumns+")")
	if err != nil {
		return fmt.Errorf("prepare events insert: %w", err)
	}
	defer func() { _ = b.Abort() }() // after Send: a no-op that reports "already sent"
	cols := columnsPool.Get().(*eventColumns)
	defer func() {
		cols.reset()
		columnsPool.Put(cols)
	}()
	for len(order) > 0 {
		chunk := order[:min(len(order), insertBlockRows)]
		order = order[len(chunk):]
		cols.reset()
		for _, i := range chunk {
			if err := cols.appendRow(&rows[i], s.raw); err != nil {
				return err
			}
		}
		if err := cols.load(b.Columns()); err != nil {
			return err
		}
		if len(order) > 0 {
			if err := b.Flush(); err != nil {
				return fmt.Errorf("insert events: %w", err)
			}
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert events: %w", err)
	}
	return nil
}

func (s *Store) insertDead(ctx context.Context, dead []DeadLetter) error {
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
			d.Reason, d.Raw, fnvString(fnvOffset, d.Raw)); err != nil {
			return fmt.Errorf("dead letter: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert dead letters: %w", err)
	}
	return nil
}
