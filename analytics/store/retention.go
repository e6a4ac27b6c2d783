package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Tables whose day partitions retention drops.
var retentionTables = []string{asql.EventsTable, asql.LegacyEventsTable, "hour_marks", "hour_compactions", "hour_caches", "hour_requests", "minute_requests", "hour_writer_requests", "minute_writer_requests",
	"hour_agent_requests", "minute_agent_requests", "minute_write_latencies", "hour_loop_conflicts", "hour_loop_successes", "dead_letters", "field_versions",
	"hour_field_changes", "hour_field_bounds", "hour_object_bounds", "hour_version_conflicts",
	"block_caches", "block_field_changes", "block_field_bounds", "block_object_bounds",
	"hour_object_noops", "hour_conflict_blockers", "hour_writer_versions",
	// unfed since migration 5
	"event_keys", "stored_keys", "duplicate_events", "request_rollup", "loop_conflicts", "loop_successes"}

// DropPartitionsBefore drops the day partitions older than cutoff's day
// from every table (retention without TTL, which 18.16 lacks). It returns
// the days it dropped from the event tables. The days come from the tables' own
// date columns, read through the Distributed tables in cluster mode (a
// shard may hold a day that another does not); dropping a partition a
// node lacks is a no-op.
func (s *Store) DropPartitionsBefore(ctx context.Context, cutoff time.Time) ([]string, error) {
	limit := cutoff.UTC().Format(time.DateOnly)
	var dropped []string
	for _, table := range retentionTables {
		col := "event_date"
		if table == "dead_letters" {
			col = "received_date"
		}
		rows, err := s.conn.Query(ctx, "SELECT DISTINCT toString("+col+") FROM "+s.db+"."+table+" WHERE "+col+" < toDate(?)", limit)
		if err != nil {
			return dropped, fmt.Errorf("list days of %s: %w", table, err)
		}
		var days []string
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				rows.Close()
				return dropped, err
			}
			days = append(days, d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return dropped, err
		}
		slices.Sort(days)
		for _, d := range days {
			if !partitionDate.MatchString(d) {
				continue
			}
			if err := s.execDDL(ctx, fmt.Sprintf("ALTER TABLE {db}.%s DROP PARTITION '%s'", table, d)); err != nil {
				return dropped, fmt.Errorf("drop partition %s of %s: %w", d, table, err)
			}
			if (table == asql.EventsTable || table == asql.LegacyEventsTable) && !slices.Contains(dropped, d) {
				dropped = append(dropped, d)
			}
		}
	}
	slices.Sort(dropped)
	return dropped, nil
}

// partitionDate is a day as toString(Date) writes it.
var partitionDate = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
