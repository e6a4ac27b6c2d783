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
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/audit"
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
	// ClickHouseCluster, when set, names a cluster of the servers'
	// remote_servers: the schema is then created ON CLUSTER as replicated
	// local tables behind Distributed tables (cluster.go). Empty: one node.
	ClickHouseCluster string
}

// Store writes rows to ClickHouse exactly once: Insert drops the events
// that the key tables say are stored already, and records in
// duplicate_events every event that racing writers stored more than once,
// so that the report counts it once (docs/auditsink.md, "Exactly once").
type Store struct {
	conn driver.Conn
	db   string
	raw  bool
	// ddl renders DDL for a cluster; nil on a single node.
	ddl *clusterDDL
	// pending holds the days a check read without a node that was down.
	pending pendingScan
	// legacyDays are the days event_keys holds parts of, listed by
	// Migrate (one node): migration 4 stopped filling event_keys, so the
	// lookup of a batch on any other day reads stored_keys alone. Nil
	// until Migrate ran: the lookup reads event_keys on every day.
	legacyDays atomic.Pointer[map[string]struct{}]
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
	var ddl *clusterDDL
	if o.ClickHouseCluster != "" {
		if ddl, err = newClusterDDL(o.ClickHouseCluster); err != nil {
			return nil, err
		}
		ddl.applySettings(opts)
	}
	// The settings a server needs depend on its version (settingsFor),
	// which the first query that reaches it reads from the handshake.
	conn, err := openServerConn(opts)
	if err != nil {
		return nil, fmt.Errorf("open ClickHouse: %w", err)
	}
	return &Store{conn: conn, db: o.Database, raw: o.KeepRaw, ddl: ddl}, nil
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

// InsertResult counts what Insert did.
type InsertResult struct {
	Stored     int // rows inserted into events
	Duplicates int // rows dropped: stored before, or repeated in the batch
	Dead       int // dead letters inserted
	// Doubled counts the rows found stored more than once (a concurrent
	// writer inserted them too), recorded in duplicate_events.
	Doubled int
	// Partial: a ClickHouse node did not answer the checks (cluster mode),
	// so the days of the batch wait for a duplicate scan (ScanPending).
	Partial bool
}

// Insert stores rows and dead letters. Rows whose key (cluster, audit_id,
// stage, fingerprint) is already stored, or repeated within rows, are
// dropped. Insert is idempotent: calling it again with the same input
// after an error or a crash stores nothing twice (stored_keys is filled by
// a materialized view in the same INSERT as events).
//
// Insert encodes the rows as spool records and stores them with
// InsertRecords, the path the sink's writer takes.
func (s *Store) Insert(ctx context.Context, rows []audit.Row, dead []audit.DeadLetter) (InsertResult, error) {
	set, err := recordSetOf(rows, dead, s.raw)
	if err != nil {
		return InsertResult{}, err
	}
	return s.InsertRecords(ctx, set)
}

// InsertRecords stores the rows and dead letters of a record set exactly
// once, like Insert. It does not change the set, so a failed call can be
// repeated with it.
//
// The key lookup and the insert are not atomic: two writers can both find
// a key missing and both insert it, and every view then counts it twice.
// So after its insert InsertRecords looks the batch's keys up again and
// records each key stored more than once in duplicate_events, which the
// report subtracts. Of two racing writers the one whose check starts last
// sees both copies: each check starts after its own insert returned. A
// retry (or a replay after a crash) whose lookup finds copies records them
// too.
func (s *Store) InsertRecords(ctx context.Context, set *RecordSet) (InsertResult, error) {
	return s.insertRecords(ctx, set, true)
}

// insertRecords is InsertRecords; lookup false skips the lookup before the
// insert, which makes the race of two writers certain (for tests).
func (s *Store) insertRecords(ctx context.Context, set *RecordSet, lookup bool) (InsertResult, error) {
	var res InsertResult
	gen := s.pending.generation()
	rows, _ := dedup(set.rows, nil)
	fresh, doubled := rows, map[eventKey]uint32{}
	check := keyQuery{doubled: true}
	if lookup && len(rows) > 0 {
		// A copy that a concurrent writer stored before this lookup
		// started, the lookup sees; so the check reads only what was
		// stored since.
		check.since = time.Now()
		var err error
		if s.ddl == nil {
			if check.known, err = s.recentParts(ctx, secondsBack(check.since, recentMargin)+1); err != nil {
				return res, err
			}
		}
		if fresh, err = s.fresh(ctx, rows, doubled); err != nil {
			return res, err
		}
	}
	res.Duplicates = len(set.rows) - len(fresh)
	if len(fresh) > 0 {
		if err := s.insertEvents(ctx, fresh); err != nil {
			return res, err
		}
		if check.known != nil {
			var err error
			if check.recent, err = s.recentParts(ctx, secondsBack(check.since, recentMargin)); err != nil {
				return res, fmt.Errorf("check for concurrent copies: %w", err)
			}
		}
		if err := s.lookupKeys(ctx, fresh, check, func(k eventKey, copies uint32) { doubled[k] = copies }); err != nil {
			return res, fmt.Errorf("check for concurrent copies: %w", err)
		}
	}
	res.Stored = len(fresh)
	if len(doubled) > 0 {
		n, err := s.insertDuplicates(ctx, rows, doubled)
		if err != nil {
			return res, err
		}
		res.Doubled = n
	}
	if len(set.dead) > 0 {
		if err := s.insertDead(ctx, set.dead); err != nil {
			return res, err
		}
		res.Dead = len(set.dead)
	}
	res.Partial = s.pending.generation() != gen
	return res, nil
}

// fresh returns the rows (without in-batch repeats) not yet stored, and
// adds to doubled the stored ones with more than one copy.
func (s *Store) fresh(ctx context.Context, rows []rowRef, doubled map[eventKey]uint32) ([]rowRef, error) {
	stored := map[eventKey]struct{}{}
	err := s.lookupKeys(ctx, rows, keyQuery{}, func(k eventKey, copies uint32) {
		stored[k] = struct{}{}
		if copies > 1 {
			doubled[k] = copies
		}
	})
	if err != nil || len(stored) == 0 {
		return rows, err
	}
	var kept []rowRef // not rows[:0]: rows may be the caller's
	for _, r := range rows {
		if _, ok := stored[r.key]; !ok {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// keyQuery is what a key lookup asks for.
type keyQuery struct {
	// doubled asks for the keys with more than one copy only: the check
	// for copies a concurrent writer stored.
	doubled bool
	// since, when set, reads only the parts of stored_keys written from
	// then on (less recentMargin; one node): the copies a concurrent
	// writer stored before the lookup of the batch started, that lookup
	// saw. On a day-sized table the check then reads the batch's and its
	// racers' parts instead of granules of most of the day's keys.
	since time.Time
	// known are the recent parts of stored_keys (name to rows) listed
	// before the batch's lookup started, and recent those listed after its
	// insert returned (one node). If the parts new in recent hold exactly
	// the batch's rows, no other writer (nor another batch of this Store)
	// stored anything since the lookup, so no copy can have raced it, and
	// the check reads nothing.
	known, recent map[string]uint64
}

// secondsBack is how many whole seconds before the server's now() a part
// written at since, less margin, may be dated.
func secondsBack(since time.Time, margin time.Duration) int64 {
	return int64((time.Since(since) + margin + time.Second - 1) / time.Second)
}

// recentMargin is how much earlier than keyQuery.since a part may have
// been written and still be read: part modification times are whole
// seconds of the server's clock, compared with its now().
const recentMargin = 2 * time.Second

// lookupKeys calls found for each stored key that shares an audit ID with
// rows (callers match the keys against rows; the check for copies may
// also report another batch's doubled keys), with its copies in
// stored_keys (0 for an event stored before migration 4, which only
// event_keys knows).
func (s *Store) lookupKeys(ctx context.Context, rows []rowRef, q keyQuery, found func(eventKey, uint32)) error {
	for cluster, rs := range byCluster(rows) {
		if err := s.lookup(ctx, cluster, rs, q, found); err != nil {
			return err
		}
	}
	return nil
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

// lookup returns the stored keys that share an audit ID with rows, with
// their copies in stored_keys. The batch's audit IDs travel as an external
// table of the native protocol (a data block, not a literal IN list the
// server would have to parse), and the days of the batch prune the
// partitions read; both tables are ordered by the key, so the audit IDs
// select a few granules.
func (s *Store) lookup(ctx context.Context, cluster string, rows []rowRef, kq keyQuery, found func(eventKey, uint32)) error {
	if s.ddl != nil {
		return s.lookupEveryReplica(ctx, cluster, rows, kq, found)
	}
	keys, dayList, err := batchKeys(rows)
	if err != nil {
		return err
	}
	days := clickhouse.GroupSet{Value: dayList}
	if kq.doubled && !kq.since.IsZero() {
		ok, err := s.checkRecentParts(ctx, days, kq, len(rows), cluster, found)
		if ok || err != nil {
			return err
		}
	}
	args := []any{days, cluster}
	where := " WHERE event_date IN ? AND cluster = ? AND audit_id IN (SELECT audit_id FROM batch_keys)"
	q := "SELECT audit_id, toString(stage), fingerprint, toUInt32(count()) AS copies FROM " + s.db + ".stored_keys" + where +
		" GROUP BY audit_id, stage, fingerprint"
	switch {
	case kq.doubled:
		q += " HAVING copies > 1"
	case s.legacyOn(dayList):
		q = "SELECT audit_id, toString(stage), fingerprint, toUInt32(sum(copy)) FROM (" +
			"SELECT audit_id, stage, fingerprint, toUInt8(0) AS copy FROM " + s.db + ".event_keys" + where +
			" UNION ALL SELECT audit_id, stage, fingerprint, toUInt8(1) AS copy FROM " + s.db + ".stored_keys" + where +
			") GROUP BY audit_id, stage, fingerprint"
		args = append(args, args...)
	}
	return s.queryKeys(ctx, keys, q, args, cluster, found)
}

// legacyOn reports whether event_keys may hold keys of the days (dates
// as text): Migrate has not listed its days yet, or one of them is listed.
func (s *Store) legacyOn(days []any) bool {
	legacy := s.legacyDays.Load()
	if legacy == nil {
		return true
	}
	return slices.ContainsFunc(days, func(d any) bool {
		_, ok := (*legacy)[d.(string)]
		return ok
	})
}

// listLegacyDays lists the days event_keys holds parts of, once migration
// 4 has stopped its view: from then on no day is added.
func (s *Store) listLegacyDays(ctx context.Context) error {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT toString(arrayJoin([min_date, max_date])) FROM system.parts WHERE database = ? AND table = 'event_keys' AND active", s.db)
	if err != nil {
		return fmt.Errorf("list the days of event_keys: %w", err)
	}
	defer rows.Close()
	days := map[string]struct{}{}
	for rows.Next() {
		var day string
		if err := rows.Scan(&day); err != nil {
			return fmt.Errorf("list the days of event_keys: %w", err)
		}
		days[day] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list the days of event_keys: %w", err)
	}
	s.legacyDays.Store(&days)
	return nil
}

// queryKeys runs a key lookup q (columns audit_id, stage, fingerprint,
// copies), with the batch's keys as batch_keys unless keys is nil, and
// calls found for each row.
func (s *Store) queryKeys(ctx context.Context, keys *ext.Table, q string, args []any, cluster string, found func(eventKey, uint32)) error {
	if keys != nil {
		ctx = clickhouse.Context(ctx, clickhouse.WithExternalTable(keys))
	}
	res, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("look up stored event keys: %w", lookupError{err})
	}
	defer res.Close()
	for res.Next() {
		k := eventKey{cluster: cluster}
		var copies uint32
		if err := res.Scan(&k.auditID, &k.stage, &k.fingerprint, &copies); err != nil {
			return fmt.Errorf("scan event key: %w", err)
		}
		found(k, copies)
	}
	return res.Err()
}

// checkRecentParts is the check for copies that reads only the parts of
// stored_keys written since the batch's lookup started: their names are
// listed first, and the read names them (18.16 skips the other parts only
// for names given as literals). A merge that replaces a listed part
// between the listing and the read would hide its rows, so the listed
// parts must still be active after the read; if one is not, ok is false
// and the caller runs the whole check.
//
// When the parts new since kq.known (in kq.recent, or as listed here,
// which is after the insert too) hold just the batch's rows (inserted),
// nothing else was stored since the lookup, and the check
// is done without reading: a racing writer's copy is a part of its own,
// or, merged, makes a part holding more rows. Otherwise the check reads
// the new parts only (all recent ones when kq.known is not set): a copy
// the lookup did not see is in a part written after kq.known was listed.
//
// The read needs no batch keys: it hashes each row's audit ID and
// fingerprint and counts the hashes seen more than once in those parts (a
// UInt64 aggregation, no set of the batch's IDs). Only if there are any
// does a second read group their rows by the key. It returns every key
// stored more than once in those parts, of this batch or not; the caller
// keeps the batch's own.
func (s *Store) checkRecentParts(ctx context.Context, days clickhouse.GroupSet, kq keyQuery, inserted int, cluster string, found func(eventKey, uint32)) (ok bool, err error) {
	recent := kq.recent
	if recent == nil {
		var err error
		if recent, err = s.recentParts(ctx, secondsBack(kq.since, recentMargin)); err != nil {
			return false, err
		}
	}
	parts := make([]any, 0, len(recent))
	var added uint64 // the rows of the new parts
	for name, rows := range recent {
		if _, seen := kq.known[name]; !seen {
			parts, added = append(parts, name), added+rows
		}
	}
	if len(parts) == 0 {
		return false, nil
	}
	if kq.known != nil && added == uint64(inserted) {
		return true, nil
	}
	inParts := clickhouse.GroupSet{Value: parts}
	repeated := "SELECT cityHash64(audit_id, fingerprint) AS h FROM " + s.db + ".stored_keys WHERE event_date IN ? AND _part IN ? GROUP BY h HAVING count() > 1"
	var hashes uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM ("+repeated+")", days, inParts).Scan(&hashes); err != nil {
		return false, fmt.Errorf("look up stored event keys: %w", lookupError{err})
	}
	if hashes > 0 {
		q := "SELECT audit_id, toString(stage), fingerprint, toUInt32(count()) AS copies FROM " + s.db + ".stored_keys" +
			" WHERE event_date IN ? AND cluster = ? AND _part IN ? AND cityHash64(audit_id, fingerprint) IN (" + repeated + ")" +
			" GROUP BY audit_id, stage, fingerprint HAVING copies > 1"
		if err := s.queryKeys(ctx, nil, q, []any{days, cluster, inParts, days, inParts}, cluster, found); err != nil {
			return false, err
		}
	}
	// A second earlier than the first listing, so that its parts are all
	// listed again while still active.
	still, err := s.recentParts(ctx, secondsBack(kq.since, recentMargin)+1)
	if err != nil {
		return false, err
	}
	for _, name := range parts {
		if _, ok := still[name.(string)]; !ok {
			return false, nil
		}
	}
	return true, nil
}

// recentParts lists the active parts of stored_keys written from back
// seconds before the server's now() on, with their rows.
func (s *Store) recentParts(ctx context.Context, back int64) (map[string]uint64, error) {
	rows, err := s.conn.Query(ctx, "SELECT name, rows FROM system.parts WHERE database = ? AND table = 'stored_keys' AND active AND modification_time >= now() - ?", s.db, back)
	if err != nil {
		return nil, fmt.Errorf("list the parts of stored_keys: %w", lookupError{err})
	}
	defer rows.Close()
	parts := map[string]uint64{}
	for rows.Next() {
		var name string
		var n uint64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		parts[name] = n
	}
	return parts, rows.Err()
}

// batchKeys returns the rows' audit IDs as the external table batch_keys,
// and the days they fall on.
func batchKeys(rows []rowRef) (*ext.Table, []any, error) {
	keys, err := ext.NewTable("batch_keys", ext.Column("audit_id", "String"))
	if err != nil {
		return nil, nil, err
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
		return nil, nil, err
	}
	dayList := make([]any, 0, len(days))
	for d := range days {
		dayList = append(dayList, time.Unix(d*86400, 0).UTC().Format(time.DateOnly))
	}
	return keys, dayList, nil
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

// insertDuplicates records the rows whose keys doubled names as stored
// more than once, each with its copies, in duplicate_events, and returns
// how many it recorded.
func (s *Store) insertDuplicates(ctx context.Context, rows []rowRef, doubled map[eventKey]uint32) (int, error) {
	var copies []uint32
	var dup []int
	for i := range rows {
		if c, ok := doubled[rows[i].key]; ok {
			dup = append(dup, i)
			copies = append(copies, c)
		}
	}
	if len(dup) == 0 {
		return 0, nil // copies of other events with the same audit IDs
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".duplicate_events ("+EventColumns+", copies)")
	if err != nil {
		return 0, fmt.Errorf("prepare duplicate_events insert: %w", err)
	}
	defer func() { _ = b.Abort() }()
	cols := columnsPool.Get().(*eventColumns)
	defer func() {
		cols.reset()
		columnsPool.Put(cols)
	}()
	cols.reset()
	for _, i := range dup {
		if err := cols.appendRow(&rows[i], s.raw); err != nil {
			return 0, err
		}
	}
	dst := b.Columns()
	if len(dst) != len(eventColumnTypes)+1 {
		return 0, fmt.Errorf("duplicate_events insert: the server asked for %d columns, want %d", len(dst), len(eventColumnTypes)+1)
	}
	if err := cols.load(dst[:len(eventColumnTypes)]); err != nil {
		return 0, err
	}
	if _, err := dst[len(eventColumnTypes)].Append(copies); err != nil {
		return 0, fmt.Errorf("duplicate_events insert: copies: %w", err)
	}
	if err := b.Send(); err != nil {
		return 0, fmt.Errorf("insert duplicate_events: %w", err)
	}
	return len(dup), nil
}

// ScanDuplicates records in duplicate_events every event of the days from
// since on that stored_keys holds more than once. The writers record the
// copies they see right after their insert; the scan catches the rest: a
// writer killed between its insert and its check while the other writer of
// the same event checked too early. It is idempotent (duplicate_events keeps
// the highest count per event) and reads stored_keys of those days whole,
// and of events only the granules of the duplicated keys.
func (s *Store) ScanDuplicates(ctx context.Context, since time.Time) error {
	day := since.UTC().Format(time.DateOnly)
	if s.ddl != nil {
		return s.scanEveryReplica(ctx, day)
	}
	doubled := `SELECT cluster, audit_id, stage, fingerprint, toUInt32(count()) AS copies
		FROM ` + s.db + `.stored_keys WHERE event_date >= toDate(?)
		GROUP BY cluster, audit_id, stage, fingerprint HAVING copies > 1`
	q := `INSERT INTO ` + s.db + `.duplicate_events (` + EventColumns + `, copies)
	SELECT ` + EventColumns + `, copies FROM (
		SELECT ` + EventColumns + ` FROM ` + s.db + `.events
		PREWHERE event_date >= toDate(?) AND (cluster, audit_id, stage, fingerprint) IN (
			SELECT cluster, audit_id, stage, fingerprint FROM (` + doubled + `))
		LIMIT 1 BY cluster, audit_id, stage, fingerprint
	) AS e ANY INNER JOIN (` + doubled + `) AS d USING (cluster, audit_id, stage, fingerprint)`
	if err := s.conn.Exec(ctx, q, day, day, day); err != nil {
		return fmt.Errorf("scan for duplicates: %w", err)
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
