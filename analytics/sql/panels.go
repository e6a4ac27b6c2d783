package sql

import (
	"slices"
	"strconv"
)

// Statements the dashboards and alert rules read beside the report's:
// series over buckets narrower than the hour caches' hours, the panels'
// own caches (user agent, latency), events themselves, and single
// numbers for alerts.
var (
	// ConflictRateSeries is the rate per bucket; a bucket with fewer than
	// @min_bucket_writes write attempts has none (a handful of writes
	// makes a rate that jumps between 0 and 100 %).
	ConflictRateSeries = Statement{Name: "conflict_rate_series", Title: "Version-conflict rate", Shape: Series,
		Params: with(requestFiltered, IntervalS, MinBucketWrites), Time: seriesTime,
		Columns: []string{"time", "conflict_rate"},
		SQL: `
SELECT time, conflict_rate
FROM (
	SELECT {bucket} AS time, toUInt64(sum(version_conflicts)) AS conflicts, toUInt64(sum(write_attempts)) AS attempts, ` + rateOfAttempts + `
	FROM ` + countedSeries + `
	GROUP BY time
)
WHERE attempts >= greatest(toUInt64(@min_bucket_writes), 1)
ORDER BY time`}

	// ConflictKindsSeries is each kind's 409s per second in each bucket
	// (the bucket's count over its @interval_s seconds), so that a zoom,
	// which changes the buckets' width, does not change the values; so are
	// the other count series.
	ConflictKindsSeries = Statement{Name: "conflict_kinds_series", Title: "Conflicts by kind", Shape: Series,
		Params: with(requestFiltered, IntervalS), Time: seriesTime,
		Columns: []string{"time", "version", "field", "delete_precondition", "already_exists", "other"},
		SQL: `
SELECT {bucket} AS time, sum(version_conflicts) / @interval_s AS version, sum(field_conflicts) / @interval_s AS field,
	sum(delete_precondition_conflicts) / @interval_s AS delete_precondition, sum(already_exists) / @interval_s AS already_exists,
	sum(other_conflicts) / @interval_s AS other
FROM ` + countedSeries + `
GROUP BY time
ORDER BY time`}

	StamplessGoneSeries = Statement{Name: "stampless_gone_series", Title: "Stampless updates and 410 Gone", Shape: Series,
		Params: with(requestFiltered, IntervalS), Time: seriesTime,
		Columns: []string{"time", "stampless_updates", "gone"},
		SQL: `
SELECT {bucket} AS time, sum(stampless_updates) / @interval_s AS stampless_updates, sum(gone) / @interval_s AS gone
FROM ` + countedSeries + `
GROUP BY time
ORDER BY time`}

	// WriteLatencySeries measures write latency from the audit timestamps
	// (the stage timestamp minus requestReceivedTimestamp), per resource:
	// exact quantiles of the writes, weighted by how many took each
	// latency (latencies).
	WriteLatencySeries = Statement{Name: "write_latency_series", Title: "Write latency by resource", Shape: Series,
		Params: with(requestFiltered, IntervalS), Time: seriesTime,
		Columns: []string{"time", "resource", "p50", "p99"},
		SQL: `
SELECT time, resource, q[1] / 1000000 AS p50, q[2] / 1000000 AS p99
FROM (
	SELECT {bucket} AS time, resource, quantilesExactWeighted(0.5, 0.99)(latency_us, writes) AS q
	FROM ` + latencies + `
	GROUP BY time, resource
)
ORDER BY time, resource`}

	ConflictsByNamespace = Statement{Name: "conflicts_by_namespace", Title: "Version conflicts by namespace", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"namespace", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT namespace, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + counted + `
WHERE write_attempts != 0
GROUP BY namespace
HAVING attempts > 0
ORDER BY conflicts DESC, attempts DESC, namespace ASC
LIMIT @top`}

	ConflictsByUserAgent = Statement{Name: "conflicts_by_user_agent", Title: "Version conflicts by user agent", Shape: Rows,
		Params: with(requestFiltered, Top), Time: []Window{RollupHours, MinuteSpans, RawEdges, RawRange, EventsWhole},
		Columns: []string{"user_agent", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT user_agent, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + agentCounted + `
WHERE write_attempts != 0
GROUP BY user_agent
HAVING attempts > 0
ORDER BY conflicts DESC, attempts DESC, user_agent ASC
LIMIT @top`}

	UnresolvedRetryLoops = Statement{Name: "unresolved_retry_loops", Title: "Unresolved retry loops", Shape: Rows,
		Params: RetryLoops.Params, Time: RetryLoops.Time,
		Columns: []string{"user", "api_group", "resource", "namespace", "name", "conflicts", "first", "last"},
		SQL:     loopRows(`resolved = 0`)}

	ResolvedRetryLoops = Statement{Name: "resolved_retry_loops", Title: "Resolved retry loops", Shape: Rows,
		Params: RetryLoops.Params, Time: RetryLoops.Time,
		Columns: []string{"user", "api_group", "resource", "namespace", "name", "conflicts", "first", "last"},
		SQL:     loopRows(`resolved = 1`)}

	StamplessByWriter = Statement{Name: "stampless_by_writer", Title: "Stampless updates by writer", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"user", "count"},
		SQL: `
SELECT writer AS user, toUInt64(sum(stampless_updates)) AS count
FROM ` + counted + `
WHERE stampless_updates != 0
GROUP BY user
HAVING count > 0
ORDER BY count DESC, user
LIMIT @top`}

	PolicyDecisionsSeries = Statement{Name: "policy_decisions_series", Title: "stampguard decisions by action", Shape: Series,
		Params: with(requestFiltered, IntervalS), Time: []Window{EventsWhole, Bucket},
		Columns: []string{"time", "action", "count"},
		SQL: `
SELECT {bucket} AS time, action, count() / @interval_s AS count
FROM ` + decisions + `
GROUP BY time, action
ORDER BY time, action`}

	// LeaseConflicts are the version conflicts on each lease: writers
	// racing for leadership, or renewing from a stale read.
	LeaseConflicts = Statement{Name: "lease_conflicts", Title: "Version conflicts on leases", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"namespace", "name", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT namespace, name, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + counted + `
WHERE api_group = 'coordination.k8s.io' AND resource = 'leases' AND write_attempts != 0
GROUP BY namespace, name
HAVING attempts > 0
ORDER BY conflicts DESC, attempts DESC, namespace, name
LIMIT @top`}

	// ConflictRate is the window's version-conflict rate, 0 below
	// @min_writes write attempts: the conflict-storm and climbing alerts.
	ConflictRate = Statement{Name: "conflict_rate", Title: "Version-conflict rate", Shape: Number,
		Params: with(filtered, MinWrites), Time: countedTime,
		Columns: []string{"conflict_rate"},
		SQL: `
SELECT if(sum(write_attempts) >= greatest(toInt64(@min_writes), 1), sum(version_conflicts) / sum(write_attempts), 0) AS conflict_rate
FROM ` + counted}

	// WriteAttempts is the window's write attempts: the climbing rule's
	// guard on its baseline (a rate of a quiet hour says nothing).
	WriteAttempts = Statement{Name: "write_attempts", Title: "Write attempts", Shape: Number,
		Params: filtered, Time: countedTime,
		Columns: []string{"write_attempts"},
		SQL: `
SELECT toUInt64(sum(write_attempts)) AS write_attempts
FROM ` + counted}

	// StaleRetryLoops are the writers that gave up in a retry loop: per
	// writer and object, the version conflicts of its unresolved retry
	// loops whose last conflict is more than @stale_us before the window's
	// end (no success by that writer on that object since). One row per
	// (writer, object), so that an alert rule makes one alert instance of
	// each, labelled with its string columns. A loop stays here until the
	// writer succeeds on the object or its conflicts leave the window.
	StaleRetryLoops = Statement{Name: "stale_retry_loops", Title: "Stale unresolved retry loops", Shape: Rows,
		Params: with(RetryLoops.Params, StaleUs), Time: []Window{LoopRollupHours, RawEdges, RawRange, Whole, End},
		Columns: []string{"writer", "namespace", "object", "conflicts"},
		SQL: `
SELECT user AS writer, namespace, concat(resource, if(api_group = '', '', concat('.', api_group)), '/', name) AS object,
	toUInt64(sum(conflicts)) AS conflicts
FROM (` + retryLoops + `)
WHERE resolved = 0 AND last_us + @stale_us < {end_us}
GROUP BY writer, namespace, object
ORDER BY conflicts DESC, writer, namespace, object`}

	// GoneByWriter is who gets 410 Gone: lists and watches whose
	// resourceVersion had expired, per writer and resource. A client that
	// gets many relists from scratch.
	GoneByWriter = Statement{Name: "gone_by_writer", Title: "410 Gone by writer", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"user", "api_group", "resource", "count"},
		SQL: `
SELECT writer AS user, api_group, resource, toUInt64(sum(gone)) AS count
FROM ` + counted + `
WHERE gone != 0
GROUP BY user, api_group, resource
HAVING count > 0
ORDER BY count DESC, user, api_group, resource
LIMIT @top`}

	// LeaseChangesSeries is lease holder changes over time, per second of
	// each bucket: each change of LeaseHolderChanges (a holder other than
	// the lease's previous non-empty holder in the range) in its bucket,
	// per lease.
	LeaseChangesSeries = Statement{Name: "lease_changes_series", Title: "Lease holder changes over time", Shape: Series,
		Params: with(requestFiltered, IntervalS), Time: []Window{EventsWhole, Bucket},
		Columns: []string{"time", "lease", "changes"},
		SQL: `
SELECT {bucket} AS time, lease, count() / @interval_s AS changes
FROM (
	SELECT lease, toDateTime(intDiv(changed_us, 1000000)) AS event_time
	FROM (
		SELECT concat(namespace, '/', name) AS lease,
			arraySort(groupArray((event_time_us, lease_holder))) AS held,
			arrayMap(x -> tupleElement(x, 2), held) AS hs,
			arrayJoin(arrayFilter((t, h, p) -> h != p AND p != '', arrayMap(x -> tupleElement(x, 1), held), hs, arrayPushFront(arrayPopBack(hs), ''))) AS changed_us
		FROM ` + AllEvents(`{events_window}`, requests+` AND api_group = 'coordination.k8s.io' AND resource = 'leases' AND subresource = ''
			AND `+IsWrite+` AND `+IsSuccess+` AND lease_holder != ''`) + `
		GROUP BY namespace, name
	)
)
GROUP BY time, lease
ORDER BY time, lease`}

	// RawEvents are the requests themselves, newest first: the drill-down
	// from a hot object, a retry loop or a writer (set the filters) to
	// what the audit log recorded. It reads events_by_hour's newest hours
	// of the window only (newestHours).
	RawEvents = Statement{Name: "raw_events", Title: "Audit events", Shape: Rows,
		Params: requestFiltered, Time: []Window{EventsWhole, RollupHours, Start, End},
		Columns: []string{"time", "writer", "user_agent", "verb", "code", "reason", "message", "stamp", "field_manager", "namespace", "resource", "name", "audit_id"},
		SQL: `
SELECT event_time AS time, writer, user_agent, verb, code, reason, message, stamp, field_manager, namespace, resource, name, audit_id
FROM ` + distinct(`event_time, event_time_us, writer, user_agent, verb, code, reason, message, stamp, field_manager, namespace, resource, name, audit_id`,
			allEventsIn(`{events_window}`, newestHours(rawEventsLimit), Request+` AND cluster = @cluster AND {filters} AND {request_filters}`), `1`) + `
ORDER BY event_time_us DESC, audit_id
LIMIT ` + strconv.Itoa(rawEventsLimit)}

	// StormIntervals are the storm rule's windows that were storms: every
	// @storm_s of the range (aligned to the epoch) whose version-conflict
	// rate was above @storm_rate over at least @min_writes write attempts,
	// as time, timeEnd and text for a dashboard annotation.
	StormIntervals = Statement{Name: "storm_intervals", Title: "Version-conflict storms", Shape: Rows,
		Params: with(requestFiltered, MinWrites, StormS, StormRate), Time: []Window{RollupHours, MinuteSpans, RawEdges, RawRange, EventsWhole},
		Columns: []string{"time", "timeEnd", "text"},
		SQL: `
SELECT toDateTime(b) AS time, toDateTime(b + @storm_s) AS timeEnd,
	concat('Version-conflict storm: ', toString(conflicts), ' of ', toString(attempts), ' writes') AS text
FROM (
	SELECT intDiv(toUInt32(event_time), @storm_s) * @storm_s AS b, toUInt64(sum(write_version_conflicts)) AS conflicts, toUInt64(sum(write_attempts)) AS attempts
	FROM ` + seriesCounted("@storm_s") + `
	GROUP BY b
)
WHERE attempts >= greatest(toUInt64(@min_writes), 1) AND conflicts > @storm_rate * attempts
ORDER BY time`}

	// AuditedStamplessWrites counts the stampless writes that a policy in
	// Audit mode let through on a guarded kind (it would have denied them).
	AuditedStamplessWrites = Statement{Name: "audited_stampless_writes", Title: "Stampless writes let through by Audit", Shape: Number,
		Params: requestFiltered, Time: []Window{EventsWhole},
		Columns: []string{"writes"},
		SQL: `
SELECT count() AS writes
FROM ` + decisions + `
WHERE kind = 'stamp-missing' AND action = 'audit'`}
)

// latencies are the window's writes as (event_time, resource,
// latency_us, writes) rows: when the buckets are whole minutes and no
// filter names a column the latency caches lack (minuteBuckets, the
// name), the clean hours from minute_write_latencies (each minute as its
// event_time) and the rest from events, as counted places them, one row
// per write; otherwise the whole window from events.
var latencies = splitRows{hours: "minute_write_latencies", minutes: "minute_write_latencies",
	cached: `minute AS event_time, resource, latency_us, writes`, filters: namelessFilters,
	rawColumns: `event_time, resource, latency_us`, raw: `event_time, resource, latency_us, toUInt64(1) AS writes`,
	where: Request + ` AND ` + IsWrite + ` AND cluster = @cluster AND {filters}`,
	when:  `(` + minuteBuckets("@interval_s") + ` AND ` + unnamed + `)`}.sql()

// rawEventsLimit is how many events RawEvents lists.
const rawEventsLimit = 500

// newestHours is the condition, on events_by_hour's key, that an event
// lies in the window's hours from the newest clean whole hour on after
// which (itself included) the hour caches count at least limit requests
// of the filters (the writer caches' when they answer the filters, the
// object caches' otherwise): no event of an earlier hour can be among the
// newest limit. The other hours count no requests here, so the condition
// never leaves out an hour it needs: without clean hours, or with a
// request filter (the caches keep no verb or code), it holds the whole
// window.
func newestHours(limit int) string {
	const first, last = `intDiv({start_us}, 3600000000)`, `intDiv({end_us} - 1, 3600000000)`
	return HourKey + ` IN (
	SELECT h FROM (
		SELECT ` + first + ` + arrayJoin(range(toUInt64(` + last + ` - ` + first + ` + 1))) AS h, cs, ns
		FROM (SELECT groupArray(c) AS cs, groupArray(n) AS ns FROM (
			SELECT toUInt64(intDiv(toUInt32(hour), 3600)) AS c, sum(requests) AS n FROM (
				SELECT hour, requests FROM {db}.hour_writer_requests
				WHERE ` + gate(writerUnfiltered) + ` AND ` + unfilteredRequests + ` AND cluster = @cluster AND {rollup_window} AND ` + writerFilters + `
				UNION ALL
				SELECT hour, requests FROM {db}.hour_requests
				WHERE ` + gate(`NOT `+writerUnfiltered) + ` AND ` + unfilteredRequests + ` AND cluster = @cluster AND {rollup_window} AND {filters})
			GROUP BY c)))
	WHERE arraySum(arrayMap((c, n) -> if(c > h, n, 0), cs, ns)) < ` + strconv.Itoa(limit) + `)`
}

// loopRows lists the retry loops that match cond, with their first and
// last conflicts as DateTime for a table.
func loopRows(cond string) string {
	return `
SELECT user, api_group, resource, namespace, name, conflicts,
	toDateTime(intDiv(first_us, 1000000)) AS first, toDateTime(intDiv(last_us, 1000000)) AS last
FROM (` + retryLoops + `)
WHERE ` + cond
}

// All lists every statement: the report's, then the dashboards' and alert
// rules'.
var All = append(slices.Concat(ReportStatements, HistoryStatements, SuggestStatements),
	ConflictRateSeries, ConflictKindsSeries, StamplessGoneSeries, WriteLatencySeries,
	ConflictsByNamespace, ConflictsByUserAgent, UnresolvedRetryLoops, ResolvedRetryLoops,
	StamplessByWriter, PolicyDecisionsSeries, LeaseConflicts,
	GoneByWriter, LeaseChangesSeries, RawEvents,
	ConflictRate, WriteAttempts, StaleRetryLoops, AuditedStamplessWrites, StormIntervals, LostUpdateCount, LostUpdatesByNamespace)
