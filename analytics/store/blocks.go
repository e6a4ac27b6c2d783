package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// CompactBlocks builds the blocks of clean hours (asql.BlockSizes) from
// since's hour on that no block record names with their hours' current
// versions, and returns them, the newest first. A block is a pure function of the hour
// versions its record names (analytics/sql, history_blocks.go): a block
// built from versions that a later compaction of an hour superseded is
// never read again, and Prune deletes it; racing builders each write a
// block of their own, and readers take either.
func (s *Store) CompactBlocks(ctx context.Context, since time.Time) ([]asql.Block, error) {
	return s.compactBlocks(ctx, since, 0)
}

// blockBudget bounds the time a compaction (Compact) spends building
// blocks after its hours: a backfill of many days' blocks (a release that
// adds them, a long ingest) is spread over the compactions that follow,
// newest first, and never holds up the hours of the next one for long.
const blockBudget = time.Minute

// compactBlocks is CompactBlocks, the newest blocks first, which starts
// no further block once it has run budget or longer (none: no bound):
// every round builds one block at least, so that the rounds get through
// however long the listing takes.
func (s *Store) compactBlocks(ctx context.Context, since time.Time, budget time.Duration) ([]asql.Block, error) {
	began := time.Now()
	from := since.UTC().Truncate(time.Hour).Unix()
	clean := map[int64]uint64{}
	rows, err := s.conn.Query(ctx, "SELECT toUInt32(hour), version FROM "+s.sql(asql.CleanHours(strconv.FormatInt(max(from, 0), 10), "toUInt32(now()) + 3600"))+" ORDER BY hour")
	if err != nil {
		return nil, fmt.Errorf("list the clean hours for blocks: %w", err)
	}
	for rows.Next() {
		var h uint32
		var v uint64
		if err := rows.Scan(&h, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list the clean hours for blocks: %w", err)
		}
		clean[int64(h)] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the clean hours for blocks: %w", err)
	}
	if len(clean) == 0 {
		return nil, nil
	}
	last := int64(0)
	for h := range clean {
		last = max(last, h)
	}
	records, err := s.blockRecords(ctx, max(from, 0), last+3600)
	if err != nil {
		return nil, err
	}
	// A block is current when a record of it names the versions its
	// hours have now.
	current := map[[2]int64]bool{}
	for _, r := range records {
		if cur := hourRun(clean, r.Start.Unix(), r.Hours); cur != nil && slices.Equal(versionsOf(cur), r.HourVersions) {
			current[[2]int64{r.Start.Unix(), int64(r.Hours)}] = true
		}
	}
	var todo [][]asql.CleanHour
	for h := range clean {
		for _, n := range asql.BlockSizes {
			if h%(int64(n)*3600) != 0 || current[[2]int64{h, int64(n)}] {
				continue
			}
			if hours := hourRun(clean, h, n); hours != nil {
				todo = append(todo, hours)
			}
		}
	}
	// The newest first, and of one start the longest.
	slices.SortFunc(todo, func(a, b []asql.CleanHour) int {
		if c := b[0].Hour.Compare(a[0].Hour); c != 0 {
			return c
		}
		return len(b) - len(a)
	})
	var done []asql.Block
	for _, hours := range todo {
		if budget > 0 && len(done) > 0 && time.Since(began) >= budget {
			break
		}
		b, err := s.buildBlock(ctx, hours)
		if err != nil {
			return done, err
		}
		done = append(done, b)
	}
	return done, nil
}

// hourRun is the n clean hours from start on, nil unless every one is
// clean.
func hourRun(clean map[int64]uint64, start int64, n int) []asql.CleanHour {
	hours := make([]asql.CleanHour, 0, n)
	for i := range n {
		h := start + int64(i)*3600
		v, ok := clean[h]
		if !ok {
			return nil
		}
		hours = append(hours, asql.CleanHour{Hour: time.Unix(h, 0).UTC(), Version: v})
	}
	return hours
}

func versionsOf(hours []asql.CleanHour) []uint64 {
	vs := make([]uint64, len(hours))
	for i, h := range hours {
		vs[i] = h.Version
	}
	return vs
}

// blockRecords are the block records of [from, to) (Unix seconds), the
// newest first where two name the same block.
func (s *Store) blockRecords(ctx context.Context, from, to int64) ([]asql.BlockRecord, error) {
	rows, err := s.conn.Query(ctx, s.sql(asql.Blocks), clickhouse.Named("from_s", uint32(from)), clickhouse.Named("to_s", uint32(to)))
	if err != nil {
		return nil, fmt.Errorf("read the block records: %w", err)
	}
	defer rows.Close()
	var out []asql.BlockRecord
	for rows.Next() {
		var r asql.BlockRecord
		if err := asql.ScanBlockRecord(rows.Scan, &r); err != nil {
			return nil, fmt.Errorf("read the block records: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the block records: %w", err)
	}
	return out, nil
}

// buildBlock builds the block of hours under a new version: its caches
// for each cluster its hours hold, then its record.
func (s *Store) buildBlock(ctx context.Context, hours []asql.CleanHour) (asql.Block, error) {
	b := asql.Block{Start: hours[0].Hour, Hours: len(hours)}
	what := fmt.Sprintf("build the block of %d hours from %s", len(hours), b.Start.Format("2006-01-02T15:04Z"))
	version, err := newVersion()
	if err != nil {
		return b, err
	}
	b.Version = version
	build := asql.BuildBlock(hours)
	rows, err := s.conn.Query(ctx, s.sql(build.Clusters))
	if err != nil {
		return b, fmt.Errorf("%s: list its clusters: %w", what, err)
	}
	var clusters []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return b, fmt.Errorf("%s: list its clusters: %w", what, err)
		}
		clusters = append(clusters, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return b, fmt.Errorf("%s: list its clusters: %w", what, err)
	}
	at := clickhouse.Named("hour_s", uint32(b.Start.Unix()))
	v := clickhouse.Named("version", version)
	for _, c := range clusters {
		for _, q := range build.Inserts {
			if err := s.conn.Exec(ctx, s.sql(q), at, v, clickhouse.Named("cluster", c)); err != nil {
				return b, fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	if err := s.conn.Exec(ctx, s.sql(build.Record), at, v, clickhouse.Named("hours", uint8(len(hours))),
		clickhouse.Named("versions", versionsOf(hours))); err != nil {
		return b, fmt.Errorf("%s: record: %w", what, err)
	}
	return b, nil
}
