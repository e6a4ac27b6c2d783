package sql

import (
	"strings"
)

// The hour caches (migration 5). An insert writes events and, through a
// view in the same INSERT, one mark per block and hour the block touched,
// after the block's events part: a visible mark means its events are
// visible. A compaction of an hour counts the hour's distinct marks first,
// then aggregates the hour's events (one row per identity) into the caches
// under a fresh version, then records (hour, version, marks). An hour is
// clean while its distinct marks still number what its newest such record
// counted: marks only grow, so an equal count is the same set, and every
// event of that set is in the caches. A later insert into the hour adds a
// mark, and the hour is read from events until it is compacted again.
// Readers never see a half-written version: a version is read only once
// its record exists, and the record is written after the caches.

// CleanHours is a subquery of (hour, version): each hour in [from, to)
// whose caches hold every event of its marks, with the newest version that
// does, the one recorded last: an hour compacted again after an upgrade
// is read from the caches of the newer release (its versions are random
// numbers, so the largest says nothing). from and to are SQL expressions
// of Unix seconds, whole hours.
func CleanHours(from, to string) string {
	within := `event_date >= toDate(toDateTime(` + from + `), 'UTC') AND event_date <= toDate(toDateTime(` + to + `), 'UTC')
		AND hour >= toDateTime(` + from + `) AND hour < toDateTime(` + to + `)`
	return `(SELECT hour, argMax(version, (compacted_at, version)) AS version FROM {db}.hour_compactions
	WHERE ` + within + ` AND (hour, marks) IN (
		SELECT hour, uniqExact(mark) FROM {db}.hour_marks WHERE ` + within + ` GROUP BY hour)
	GROUP BY hour)`
}

// MinuteVersions is a query of (hour, version): those of hours, clean
// hours, whose versions have minute caches. A compactor of an earlier
// release wrote none; a compaction writes its minute caches before its
// record, so a recorded version with any minute row has all of them. (A
// version of an hour without requests has none and is read from events,
// which hold none of its requests either.)
func MinuteVersions(hours []CleanHour) string {
	return `SELECT toUInt32(hour), version FROM {db}.minute_requests
	WHERE ` + hourVersions(hours) + `
	ORDER BY hour, version
	LIMIT 1 BY hour, version`
}

// WriterVersions is a query of (hour, version): those of hours, clean
// hours, whose versions have writer caches (migration 8), and so minute
// caches too. A compaction of this release writes a row there for every
// version, requests or none, before its record (a row with no cluster); a
// compactor of an earlier release wrote none.
//
// It reads those rows only: an empty cluster sorts first.
func WriterVersions(hours []CleanHour) string {
	return `SELECT toUInt32(hour), version FROM {db}.hour_writer_requests
	WHERE cluster = '' AND ` + hourVersions(hours) + `
	ORDER BY hour, version
	LIMIT 1 BY hour, version`
}

// hourRows are the events of the hour @hour_s (Unix seconds) of a
// compaction.
var hourRows = TimeRange("@hour_s * 1000000", "(@hour_s + 3600) * 1000000")

// The statements of a compaction, in order, each with {db} to fill and the
// parameters @hour_s, @version and (the last) @marks.
var (
	// CompactionMarks counts the hour's distinct marks: the first read of
	// a compaction.
	CompactionMarks = `SELECT uniqExact(mark) FROM {db}.hour_marks WHERE event_date = toDate(toDateTime(@hour_s), 'UTC') AND hour = toDateTime(@hour_s)`

	// CompactionInserts build the hour's caches under @version.
	CompactionInserts = []string{
		compactCounters("hour_requests", objectKeys, ""),
		compactCounters("minute_requests", objectKeys, "minute"),
		compactCounters("hour_writer_requests", writerKeys, ""),
		compactCounters("minute_writer_requests", writerKeys, "minute"),
		// The version's mark in the writer caches (WriterVersions): a row
		// of zeros with no cluster, which no read matches.
		`INSERT INTO {db}.hour_writer_requests (event_date, hour, version, cluster, api_group, resource, writer, ` + counterNames + `)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), '', '', '', '', ` + counterZeros + ``,
		`INSERT INTO {db}.hour_loop_conflicts (event_date, hour, version, ` + loopConflictColumnsNoDate + `)
	SELECT event_date, toDateTime(@hour_s), toUInt64(@version), ` + loopConflictColumnsNoDate + `
	FROM ` + LoopConflictRows(hourRows, "1"),
		`INSERT INTO {db}.hour_loop_successes (event_date, hour, version, cluster, pair, event_time_us)
	SELECT event_date, toDateTime(@hour_s), toUInt64(@version), cluster, pair, event_time_us
	FROM ` + LoopSuccessRows(hourRows, "1"),
	}

	// CompactionRecord makes @version of the hour readable, for as long as
	// the hour has @marks distinct marks.
	CompactionRecord = `INSERT INTO {db}.hour_compactions (event_date, hour, version, marks, compacted_at)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version), toUInt64(@marks), now()`

	// StaleHours lists the hours from the day of @since_s on that are not
	// clean, ended @after_s seconds ago or more, and were last marked as
	// long ago (by the servers' clocks): (Unix seconds of the hour).
	StaleHours = `SELECT toUInt32(hour) AS h FROM (
		SELECT hour, uniqExact(mark) AS marks, max(marked_at) AS last FROM {db}.hour_marks
		WHERE event_date >= toDate(toDateTime(@since_s), 'UTC') AND hour <= now() - 3600 - @after_s
		GROUP BY hour
		HAVING last <= now() - @after_s)
	WHERE (hour, marks) NOT IN (SELECT hour, marks FROM {db}.hour_compactions WHERE event_date >= toDate(toDateTime(@since_s), 'UTC'))
	ORDER BY h`
)

// compactCounters builds the hour's counters per keys (and per minute,
// with minute "minute") into table under @version.
func compactCounters(table, keys, minute string) string {
	columns, group := requestColumns, "cluster, "+keys
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
