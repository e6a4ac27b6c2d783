package store

// The pieces of DDL the migrations share (schema.go).

import (
	"fmt"
	"strings"

	"github.com/stampguard/stampguard/analytics/record"
)

// epoch records from which hour a table fed by a view holds every event:
// all hours when events was empty as the view started, else from two hours
// after now (events stored before the view exist only in events). The
// report uses the table only for windows from max(complete_from) on.
func epoch(table string) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS {db}.` + table + ` (
				complete_from DateTime
			) ENGINE = MergeTree() ORDER BY complete_from`,
		`INSERT INTO {db}.` + table + ` (complete_from)
			SELECT toDateTime(if(count() = 0, 0, intDiv(toUInt32(now()), 3600) * 3600 + 7200)) FROM {db}.events`,
	}
}

// counterColumnsDDL are the request counters of request_rollup,
// hour_requests, minute_requests and the writer and agent caches (analytics/sql's
// Counters, in order).
const counterColumnsDDL = `				requests                      UInt64,
				write_attempts                UInt64,
				version_conflicts             UInt64,
				write_version_conflicts       UInt64,
				field_conflicts               UInt64,
				already_exists                UInt64,
				delete_precondition_conflicts UInt64,
				stampless_updates             UInt64,
				other_conflicts               UInt64,
				gone                          UInt64
`

// eventsColumnsDDL are the columns of events and events_by_hour
// (migrations 1 and 6), written out from record.Columns: the column table
// (columnTable, record/columns.go) the insert builds its blocks from, so
// that the tables and the insert cannot disagree. The text is byte for byte what those migrations have
// always run, and TestReleasedMigrationsAreFixed keeps it so: a column
// added to record's table would change it, so such a column needs a
// migration of its own (ALTER TABLE ... ADD COLUMN) and this list kept to
// the columns migrations 1 and 6 created.
var eventsColumnsDDL = columnListDDL(record.Columns())

// columnListDDL writes cols as the parenthesized column list of a CREATE
// TABLE, laid out as the migrations' statements are: a column a line,
// indented four tabs, each type one space after the longest name.
func columnListDDL(cols []record.Column) string {
	width := 0
	for _, c := range cols {
		width = max(width, len(c.Name))
	}
	var b strings.Builder
	b.WriteString("(\n")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, "\t\t\t\t%-*s %s", width, c.Name, c.Type)
	}
	b.WriteString("\n\t\t\t)")
	return b.String()
}
