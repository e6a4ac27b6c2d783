package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Compaction builds the hour caches that let reads skip most of events
// (analytics/sql, hours.go). It is an optimisation only: an hour without a
// clean cache is read from events, and the figures are the same. Any
// number of compactors may run at once (every serve replica, migrate,
// ingest): each writes its own version, and readers take the newest clean
// one.

// DefaultCompactAfter is how long after its end an hour is first
// compacted: the apiserver's audit batches wait up to 30 s and are
// retried for about two minutes, so most hours are complete by then and
// compacted once.
const DefaultCompactAfter = 5 * time.Minute

// CompactResult counts what Compact did.
type CompactResult struct {
	// Hours are the hours compacted.
	Hours []time.Time
	// Blocks are the blocks of clean hours built (CompactBlocks).
	Blocks []asql.Block
}

// Compact builds the caches of every hour that starts on since's day or
// later, is not clean, and ended and was last written to at least after
// ago (by ClickHouse's clocks), then the blocks of clean hours from
// since on that are not built from their hours' current versions
// (CompactBlocks), the newest first, for up to blockBudget. The wait is for a cluster: a compaction
// reads one replica of each shard, and reads only replicas less than
// replicaDelay behind (cluster.go), so every part older than that is
// there; after must exceed it.
func (s *Store) Compact(ctx context.Context, since time.Time, after time.Duration) (CompactResult, error) {
	var res CompactResult
	rows, err := s.conn.Query(ctx, s.sql(asql.StaleHours),
		clickhouse.Named("since_s", uint32(since.Unix())), clickhouse.Named("after_s", uint32(after/time.Second)))
	if err != nil {
		return res, fmt.Errorf("list the hours to compact: %w", err)
	}
	var hours []uint32
	for rows.Next() {
		var h uint32
		if err := rows.Scan(&h); err != nil {
			rows.Close()
			return res, fmt.Errorf("list the hours to compact: %w", err)
		}
		hours = append(hours, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("list the hours to compact: %w", err)
	}
	for _, h := range hours {
		hour := time.Unix(int64(h), 0).UTC()
		if err := s.CompactHour(ctx, hour); err != nil {
			return res, err
		}
		res.Hours = append(res.Hours, hour)
	}
	blocks, err := s.compactBlocks(ctx, since, blockBudget)
	res.Blocks = blocks
	return res, err
}

// CompactHour builds the caches of one hour (its start, a whole UTC hour)
// under a new version, whether or not the hour is clean already.
//
// The order is the invariant: the marks are counted before the events are
// read, so every event of a counted mark is in the caches (a mark is
// visible only after its events are); the record comes last, so no reader
// sees the version before its caches are whole.
func (s *Store) CompactHour(ctx context.Context, hour time.Time) error {
	if hour.Truncate(time.Hour) != hour {
		return fmt.Errorf("compact %s: not a whole hour", hour.Format(time.RFC3339))
	}
	version, err := newVersion()
	if err != nil {
		return err
	}
	at := clickhouse.Named("hour_s", uint32(hour.Unix()))
	v := clickhouse.Named("version", version)
	what := "compact " + hour.UTC().Format("2006-01-02T15:04Z")
	var marks uint64
	if err := s.conn.QueryRow(ctx, s.sql(asql.CompactionMarks), at).Scan(&marks); err != nil {
		return fmt.Errorf("%s: count marks: %w", what, err)
	}
	if s.hook != nil {
		s.hook(hookMarksCounted)
	}
	for _, q := range asql.CompactionInserts {
		if err := s.conn.Exec(ctx, s.sql(q), at, v); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if s.hook != nil {
		s.hook(hookCachesWritten)
	}
	if err := s.conn.Exec(ctx, s.sql(asql.CompactionRecord), at, v, clickhouse.Named("marks", marks)); err != nil {
		return fmt.Errorf("%s: record: %w", what, err)
	}
	return nil
}

// DefaultPruneAfter is how long a cache version stays after it is
// superseded (asql.SupersededVersions): far longer than any read takes.
const DefaultPruneAfter = time.Hour

// prunePerStatement caps the versions one mutation names.
const prunePerStatement = 1000

// Prune deletes the rows of the cache versions that have been superseded
// for after or longer (asql.SupersededVersions), and of the blocks built
// from them (asql.SupersededBlocks), from every cache table, then their
// records, and returns how many versions (blocks included) it named. No reader
// takes such a version: a version is read only through its record, while
// that record is the newest clean one of its layout, and a superseded
// record never is again; removing it changes no reader's choice. Every
// recompaction of an hour (a copy stored after its compaction, two
// compactors at once) writes a whole new set of its caches, which would
// otherwise stay until retention.
//
// The deletes are ClickHouse mutations (ALTER TABLE ... DELETE, DDL
// rights), which run in the background: they rewrite the parts that hold
// those rows, and a part without any unchanged. A prune while the
// mutations of an earlier one still run may name those versions again,
// which deletes nothing more.
func (s *Store) Prune(ctx context.Context, after time.Duration) (int, error) {
	grace := clickhouse.Named("grace_s", uint32(after/time.Second))
	// The blocks first: a block is listed by the hour versions it names,
	// which are listed no more once their records are gone.
	blocks, err := s.listVersions(ctx, asql.SupersededBlocks, grace)
	if err != nil {
		return 0, fmt.Errorf("list superseded blocks: %w", err)
	}
	versions, err := s.listVersions(ctx, asql.SupersededVersions, grace)
	if err != nil {
		return 0, fmt.Errorf("list superseded cache versions: %w", err)
	}
	// The records last: a version whose record is gone is never listed
	// again, so its rows must be on their way out by then (a mutation,
	// once accepted, runs to its end, through restarts too).
	if err := s.deleteVersions(ctx, blocks, append(slices.Clone(asql.BlockTables), "block_caches")); err != nil {
		return 0, err
	}
	if err := s.deleteVersions(ctx, versions, append(slices.Clone(asql.CacheTables), asql.RecordTables...)); err != nil {
		return 0, err
	}
	return len(blocks) + len(versions), nil
}

// listVersions runs q, a query of (hour in Unix seconds, version), and
// returns its rows as SQL tuples.
func (s *Store) listVersions(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := s.conn.Query(ctx, s.sql(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var versions []string
	for rows.Next() {
		var h uint32
		var v uint64
		if err := rows.Scan(&h, &v); err != nil {
			return nil, err
		}
		versions = append(versions, fmt.Sprintf("(toDateTime(%d), toUInt64(%d))", h, v))
	}
	return versions, rows.Err()
}

// deleteVersions deletes the rows of versions from tables, in order.
func (s *Store) deleteVersions(ctx context.Context, versions, tables []string) error {
	for len(versions) > 0 {
		n := min(len(versions), prunePerStatement)
		set := asql.SetOf(versions[:n])
		for _, table := range tables {
			if err := s.execDDL(ctx, "ALTER TABLE {db}."+table+" DELETE WHERE (hour, version) IN "+set); err != nil {
				return fmt.Errorf("delete superseded versions from %s: %w", table, err)
			}
		}
		versions = versions[n:]
	}
	return nil
}

// The steps of a compaction at which Store.hook runs.
const (
	hookMarksCounted  = "marks counted"
	hookCachesWritten = "caches written"
)

// sql fills in the database of an analytics/sql text.
func (s *Store) sql(q string) string { return strings.ReplaceAll(q, "{db}", s.db) }

// newVersion is a random version: compactors never share one.
func newVersion() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("compaction version: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
