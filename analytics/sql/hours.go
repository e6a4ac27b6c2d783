package sql

import (
	"regexp"
	"strconv"
	"strings"
)

// The hour caches (migration 5). An insert writes events and, through a
// view in the same INSERT, one mark per block and hour the block touched,
// after the block's events part: a visible mark means its events are
// visible. A compaction of an hour counts the hour's distinct marks first,
// then aggregates the hour's events (one row per identity) into the caches
// under a fresh version, then records (hour, layout, version, marks) in
// hour_caches. An hour is clean while its distinct marks still number
// what its newest record of this layout counted: marks only grow, so an
// equal count is the same set, and every event of that set is in the
// caches. A later insert into the hour adds a mark, and the hour is read
// from events until it is compacted again. Readers never see a
// half-written version: a version is read only once its record exists,
// and the record is written after the caches.

// CacheLayout is the set of caches a compaction of this release writes
// (CompactionInserts), named by the migration that completed it. Readers
// take records of this layout only (CleanHours), so a clean hour has every
// cache a reader reads; an hour compacted by a release with another
// layout is read from events until it is compacted again, which the
// compactor does first (StaleHours). A migration that adds or changes a
// cache raises it.
const CacheLayout = 15

// cacheLayout is CacheLayout in SQL.
var cacheLayout = "toUInt32(" + strconv.Itoa(CacheLayout) + ")"

// CleanHours is a subquery of (hour, version): each hour in [from, to)
// whose caches of this layout hold every event of its marks, with the
// newest version that does, the one recorded last (versions are random
// numbers, so the largest says nothing). from and to are SQL expressions
// of Unix seconds, whole hours.
func CleanHours(from, to string) string {
	within := `event_date >= toDate(toDateTime(` + from + `), 'UTC') AND event_date <= toDate(toDateTime(` + to + `), 'UTC')
		AND hour >= toDateTime(` + from + `) AND hour < toDateTime(` + to + `)`
	return `(SELECT hour, ` + newestVersion + ` AS version FROM ` + cleanRecords(within) + `
	GROUP BY hour)`
}

// cleanRecords are the records of this layout, of the hours that pass
// within (a condition on event_date and hour), whose marks still number
// their hour's distinct marks: a table expression, to group by hour.
func cleanRecords(within string) string {
	return `{db}.hour_caches
	WHERE ` + within + ` AND layout = ` + cacheLayout + ` AND (hour, marks) IN (
		SELECT hour, uniqExact(mark) FROM {db}.hour_marks WHERE ` + within + ` GROUP BY hour)`
}

// newestVersion is, per hour of cleanRecords, the version readers take:
// the one recorded last (versions are random numbers, so the largest
// says nothing).
const newestVersion = `argMax(version, (compacted_at, version))`

// hourRows are the events of the hour @hour_s (Unix seconds) of a
// compaction.
var hourRows = TimeRange("@hour_s * 1000000", "(@hour_s + 3600) * 1000000")

// compactedVersions are the versions of the field history in the hour of a
// compaction, the hour one segment.
var compactedVersions = segmentVersions(hourRows, "toUInt64(0)")

// The statements of a compaction, in order, each with {db} to fill and the
// parameters @hour_s, @version and (the last) @marks.
var (
	// CompactionMarks counts the hour's distinct marks: the first read of
	// a compaction.
	CompactionMarks = `SELECT uniqExact(mark) FROM {db}.hour_marks WHERE event_date = toDate(toDateTime(@hour_s), 'UTC') AND hour = toDateTime(@hour_s)`

	// CompactionInserts build the hour's caches under @version.
	CompactionInserts = []string{
		compactCounters("hour_requests", objectKeys, requestColumns, ""),
		compactCounters("minute_requests", objectKeys, requestColumns, "minute"),
		compactCounters("hour_writer_requests", writerKeys, requestColumns, ""),
		compactCounters("minute_writer_requests", writerKeys, requestColumns, "minute"),
		compactCounters("hour_agent_requests", agentKeys, agentColumns, ""),
		compactCounters("minute_agent_requests", agentKeys, agentColumns, "minute"),
		`INSERT INTO {db}.minute_write_latencies (event_date, hour, version, minute, cluster, ` + latencyKeys + `, latency_us, writes)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), toDateTime(intDiv(event_time_us, 60000000) * 60) AS minute, cluster, ` + latencyKeys + `, latency_us, count()
	FROM ` + DistinctEvents(`event_time_us, cluster, `+latencyKeys+`, latency_us`, hourRows, Request+` AND `+IsWrite) + `
	GROUP BY minute, cluster, ` + latencyKeys + `, latency_us`,
		`INSERT INTO {db}.hour_loop_conflicts (event_date, hour, version, ` + loopConflictColumnsNoDate + `)
	SELECT event_date, toDateTime(@hour_s), toUInt64(@version), ` + loopConflictColumnsNoDate + `
	FROM ` + LoopConflictRows(hourRows, "1"),
		`INSERT INTO {db}.hour_loop_successes (event_date, hour, version, cluster, pair, event_time_us)
	SELECT event_date, toDateTime(@hour_s), toUInt64(@version), cluster, pair, event_time_us
	FROM ` + LoopSuccessRows(hourRows, "1"),
		`INSERT INTO {db}.hour_field_changes (event_date, hour, version, object_hash, ` + changeColumns + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + historyHash + `, ` + changeColumns + `
	FROM ` + segmentChanges(compactedVersions, false),
		`INSERT INTO {db}.hour_field_bounds (event_date, hour, version, object_hash, ` + historyKey + `, field, ` + names(boundColumns) + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + historyHash + `, ` + historyKey + `, field, ` + names(boundColumns) + `
	FROM ` + fieldBounds(compactedVersions),
		`INSERT INTO {db}.hour_object_bounds (event_date, hour, version, object_hash, ` + historyKey + `, ` + names(objectColumns) + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), object_hash, ` + historyKey + `, ` + names(objectColumns) + `
	FROM ` + objectBounds(compactedVersions),
		`INSERT INTO {db}.hour_object_noops (event_date, hour, version, ` + historyKey + `, object_hash, ` + noopColumns + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + historyKey + `, object_hash, ` + noopColumns + `
	FROM ` + noopRecords(hourRows, "toUInt64(0)"),
		`INSERT INTO {db}.hour_conflict_blockers (event_date, hour, version, ` + blockerConflictColumns + `, blockers)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + blockerConflictColumns + `, blockers
	FROM ` + hourConflictBlockers,
		`INSERT INTO {db}.hour_writer_versions (event_date, hour, version, ` + historyKey + `, writer, max_version)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + historyKey + `, writer, max_version
	FROM ` + writerVersions(hourRows, "toUInt64(0)"),
	}

	// CompactionRecord makes @version of the hour readable, for as long as
	// the hour has @marks distinct marks.
	CompactionRecord = `INSERT INTO {db}.hour_caches (event_date, hour, layout, version, marks, compacted_at)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), ` + cacheLayout + `, toUInt64(@version), toUInt64(@marks), now()`

	// StaleHours lists the hours from the day of @since_s on that are not
	// clean in this layout (CacheLayout), ended @after_s seconds ago or
	// more, and were last marked as long ago (by the servers' clocks):
	// (Unix seconds of the hour).
	StaleHours = `SELECT toUInt32(hour) AS h FROM (
		SELECT hour, uniqExact(mark) AS marks, max(marked_at) AS last FROM {db}.hour_marks
		WHERE event_date >= toDate(toDateTime(@since_s), 'UTC') AND hour <= now() - 3600 - @after_s
		GROUP BY hour
		HAVING last <= now() - @after_s)
	WHERE (hour, marks) NOT IN (SELECT hour, marks FROM {db}.hour_caches WHERE event_date >= toDate(toDateTime(@since_s), 'UTC') AND layout = ` + cacheLayout + `)
	ORDER BY h`
)

// SupersededVersions lists the cache versions that no reader can take
// any more, as (hour in Unix seconds, version), so that their rows can be
// deleted (Store.Prune). A version is read only through its record, and
// only while that record is the newest clean one of the reader's layout
// (CleanHours). A version is superseded when, for @grace_s seconds or
// longer by the servers' clocks:
//   - its record is dirty (of any layout, either record table): marks
//     only grow, so it stays dirty, and since the hour's last mark is
//     older than the grace, so is the moment it became dirty; or
//   - its record is of this layout and another clean record of this
//     layout is the newest (cleanRecords, newestVersion: what CleanHours
//     takes), recorded that long ago.
//
// A reader that took a version before it was superseded finished long
// before the grace ended. Every other version is kept: the newest clean
// one of each layout (an earlier release's readers take theirs from
// hour_compactions, or from records of their layout), and versions
// without a record, which may be a compaction still writing.
var SupersededVersions = `SELECT DISTINCT toUInt32(hour) AS h, version FROM (
	SELECT hour, version, layout, marks, marks_now, last_mark FROM (
		SELECT hour, version, layout, marks FROM {db}.hour_caches
		UNION ALL
		SELECT hour, version, toUInt32(0) AS layout, marks FROM {db}.hour_compactions) AS records
	ANY LEFT JOIN (
		SELECT hour, uniqExact(mark) AS marks_now, max(marked_at) AS last_mark FROM {db}.hour_marks GROUP BY hour) AS now_marked USING hour) AS marked
ANY LEFT JOIN (
	SELECT hour, ` + newestVersion + ` AS newest, max(compacted_at) AS newest_at FROM ` + cleanRecords("1") + `
	GROUP BY hour) AS newest_clean USING hour
WHERE (marks != marks_now AND last_mark < now() - @grace_s)
	OR (layout = ` + cacheLayout + ` AND toUInt32(newest_at) > 0 AND version != newest AND newest_at < now() - @grace_s)
ORDER BY h, version`

// SetOf is the SQL set of tuples, which must not be empty: one tuple is
// written twice, since ((a, b)) would be that tuple, not a set of one.
func SetOf(tuples []string) string {
	if len(tuples) == 1 {
		tuples = []string{tuples[0], tuples[0]}
	}
	return "(" + strings.Join(tuples, ", ") + ")"
}

// CacheTables are the tables a compaction fills (CompactionInserts),
// every one keyed by hour and version; its record goes to hour_caches.
var CacheTables = func() []string {
	var tables []string
	for _, q := range CompactionInserts {
		m := insertInto.FindStringSubmatch(q)
		tables = append(tables, m[1])
	}
	return tables
}()

// RecordTables hold the records of compactions: hour_caches, and
// hour_compactions (migration 5, the layouts before CacheLayout).
var RecordTables = []string{"hour_caches", "hour_compactions"}

var insertInto = regexp.MustCompile(`^INSERT INTO \{db\}\.(\w+) `)

// compactCounters builds the hour's counters per keys (and per minute,
// with minute "minute") into table under @version, from events' rows of
// columns (the keys and what the counters read).
func compactCounters(table, keys, columns, minute string) string {
	group := "cluster, " + keys
	if minute != "" {
		columns += `, toDateTime(intDiv(event_time_us, 60000000) * 60) AS minute`
		group = "minute, " + group
	}
	return `INSERT INTO {db}.` + table + ` (event_date, hour, version, ` + group + `, ` + counterNames + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), ` + group + `, ` + counterSums + `
	FROM ` + DistinctEvents(columns, hourRows, Request) + `
	GROUP BY ` + group
}

// loopConflictColumnsNoDate are loopConflictColumns without event_date.
var loopConflictColumnsNoDate = strings.TrimPrefix(loopConflictColumns, "event_date, ")
