package report

import (
	"strings"

	"github.com/stampguard/stampguard/analytics"
)

// The analytics SQL is defined here once. The report runs it with the window
// as bound parameters; the dashboards and alert rules run the same
// statements with Grafana's time macros in place of the window placeholders.
// Every statement runs on ClickHouse 18.16 and on current releases: no
// window functions, no JSONExtract, no toStartOfInterval.
//
// Placeholders (filled by Query.Render from Sources):
//   - {db} is the database.
//   - {window} is the whole window on a raw table (ReportWindow). Lease
//     holders and policy decisions read raw events over the whole window;
//     retry loops read their rows ({loop_conflicts}, {loop_successes}) over
//     the whole window.
//   - {raw_window} is the part of the window that the rollup does not answer:
//     the partial hours at its edges (ReportRawWindow).
//   - {rollup_window} is the whole hours that request_rollup answers
//     (ReportRollupWindow).
//   - {loop_conflicts} and {loop_successes} are the retry-loop rows: the
//     tables of migration 3 or their raw forms (LoopConflictsRaw,
//     LoopSuccessesRaw).
//
// The counting statements (totals, by user, by resource, hot objects,
// stampless updates) read request_rollup for {rollup_window} UNION ALL the
// raw events for {raw_window}; the two are disjoint and together make the
// window, so the sums are exact. A dashboard renders them either raw-only,
// with {raw_window} = $__timeFilter(event_time) and {rollup_window} = 0, or
// split, with {rollup_window} = the whole hours of the range on `hour` and
// {raw_window} = $__timeFilter(event_time) AND NOT (those hours on
// event_time). The definitions (a request, a write, the conflict classes,
// the rollup's counters) are those of analytics/sql.go, which the views of
// the migrations select with.
//
// Bound parameters (client-side, quoted by the driver): @cluster,
// @namespace, @resource, @user (empty means any), @top, @gap_us,
// @threshold, @since_us, @until_us, @rollup_from_us, @rollup_to_us,
// @edge1_from_us, @edge1_last_us, @edge2_from_us, @edge2_last_us.
//
// Filters: namespace, resource and writer are columns of the rollup key and
// of loop_conflicts, so every filter is answered there; nothing falls back
// to raw.

// Query is one named analytics statement.
type Query struct {
	Name  string
	Title string
	SQL   string
}

// Sources fill a statement's placeholders: the time filters of each part
// of the window, and where the retry-loop rows come from.
type Sources struct {
	// Window filters the whole window on a raw table ({window}).
	Window string
	// RawWindow filters the parts of the window that request_rollup does
	// not answer ({raw_window}); RollupWindow its whole hours
	// ({rollup_window}).
	RawWindow, RollupWindow string
	// LoopConflicts and LoopSuccesses are the retry-loop rows
	// ({loop_conflicts}, {loop_successes}): the tables of migration 3, or
	// the same rows derived from events.
	LoopConflicts, LoopSuccesses string
	// Duplicates are the events stored more than once ({duplicates}), and
	// Dedup keeps one row per identity where raw events are read
	// ({dedup}): Corrected and CorrectedDedup, or, where no duplicate is
	// recorded, NoDuplicates and "" (the same answers, cheaper).
	Duplicates, Dedup string
}

// The correction for events stored more than once (migration 4).
const (
	// Corrected is duplicate_events, one row per event with the highest
	// count of copies seen.
	Corrected = `{db}.duplicate_events FINAL`
	// CorrectedDedup keeps one row per identity of a raw read.
	CorrectedDedup = `LIMIT 1 BY ` + identity
	// NoDuplicates reads nothing: for windows without a recorded duplicate.
	NoDuplicates = `(SELECT * FROM {db}.duplicate_events LIMIT 0)`
)

// ReportSources are the sources of the report: split windows, loop tables.
var ReportSources = Sources{
	Window: ReportWindow, RawWindow: ReportRawWindow, RollupWindow: ReportRollupWindow,
	LoopConflicts: LoopConflictsTable, LoopSuccesses: LoopSuccessesTable,
	Duplicates: Corrected, Dedup: CorrectedDedup,
}

// Render fills in the sources, then the time filters (which the raw
// sources use too), then the database.
func (q Query) Render(db string, s Sources) string {
	sql := strings.NewReplacer(
		"{loop_conflicts}", s.LoopConflicts, "{loop_successes}", s.LoopSuccesses,
	).Replace(q.SQL)
	sql = strings.NewReplacer("{duplicates}", s.Duplicates, "{dedup}", s.Dedup).Replace(sql)
	sql = strings.NewReplacer(
		"{window}", s.Window, "{raw_window}", s.RawWindow, "{rollup_window}", s.RollupWindow,
	).Replace(sql)
	return strings.ReplaceAll(sql, "{db}", db)
}

// ReportWindow is the report's half-open window [@since_us, @until_us) on
// the stage timestamp in microseconds, with the day partitions it spans so
// that ClickHouse reads only those.
const ReportWindow = `event_date >= toDate(toDateTime(intDiv(@since_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@until_us, 1000000))) AND event_time_us >= @since_us AND event_time_us < @until_us`

// ReportRawWindow is the window minus the rollup's whole hours: two edges,
// each the closed range [@edgeN_from_us, @edgeN_last_us] with the day
// partitions it spans. An empty edge has from > last and spans no day, so
// ClickHouse reads nothing for it (a condition the partition pruning cannot
// see through, such as if(), would make it read the day).
const ReportRawWindow = `(` + rawEdge1 + ` OR ` + rawEdge2 + `)`

const (
	rawEdge1 = `(event_date >= toDate(toDateTime(intDiv(@edge1_from_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@edge1_last_us, 1000000))) AND event_time_us >= @edge1_from_us AND event_time_us <= @edge1_last_us)`
	rawEdge2 = `(event_date >= toDate(toDateTime(intDiv(@edge2_from_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@edge2_last_us, 1000000))) AND event_time_us >= @edge2_from_us AND event_time_us <= @edge2_last_us)`
)

// ReportRollupWindow selects the rollup's whole hours [@rollup_from_us, @rollup_to_us).
const ReportRollupWindow = `hour >= toDateTime(intDiv(@rollup_from_us, 1000000)) AND hour < toDateTime(intDiv(@rollup_to_us, 1000000))`

// Building blocks, shared by the statements below.
const (
	// requests selects each request once: its ResponseComplete event, or
	// its Panic event. dryRun requests are excluded everywhere.
	requests = analytics.SQLRequest + ` AND cluster = @cluster AND {window} AND ` + filters

	// filters are the report's narrowing options, on columns that both
	// events and request_rollup have.
	filters = `(@namespace = '' OR namespace = @namespace) AND (@resource = '' OR resource = @resource) AND (@user = '' OR writer = @user)`

	// The definitions, shared with the views of the migrations.
	isWrite         = analytics.SQLIsWrite
	isSuccess       = analytics.SQLIsSuccess
	conflictClass   = analytics.SQLConflictClass
	versionConflict = analytics.SQLVersionConflict
	loopPair        = analytics.SQLLoopPair

	// objectHash identifies an object in GROUP BY and IN.
	objectHash = `cityHash64(api_group, resource, namespace, name)`
)

// identity is the dedup identity of an event. events is a
// ReplacingMergeTree on it, so a copy stored twice by racing writers is
// collapsed only once the parts merge; a raw read keeps one row per
// identity itself (LIMIT 1 BY).
const identity = `cluster, audit_id, stage, fingerprint`

// duplicates are the events stored more than once (migration 4), one row
// per event with its copies, the highest count seen (Sources.Duplicates).
const duplicates = `{duplicates}`

// counted is the window's requests as counter rows: request_rollup's whole
// hours, corrected for duplicates, UNION ALL one row per raw event at the
// edges. Sum the counters (Int64: the corrections are negative) and convert
// the sums back with toUInt64.
//
// The rollup's views count every stored copy of an event, so for each event
// stored copies > 1 times in the rollup's hours a third part adds its
// counters times -(copies - 1), computed from its columns with the same
// definitions as the views. The edges read events, where a copy may not be
// merged away yet, so they keep one row per identity.
var counted = func() string {
	var names, raw, dup []string
	for _, c := range analytics.Counters {
		names = append(names, "toInt64(rr."+c.Name+") AS "+c.Name)
		raw = append(raw, "toInt64("+c.Cond+") AS "+c.Name)
		dup = append(dup, "toInt64("+c.Cond+") * (1 - toInt64(copies)) AS "+c.Name)
	}
	columns := `writer, api_group, resource, namespace, name, verb, code, stamp, ` + conflictClass + ` AS class, ` + isWrite + ` AS is_write`
	return `(
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(names, ", ") + `
	FROM {db}.request_rollup AS rr
	WHERE cluster = @cluster AND {rollup_window} AND ` + filters + `
	UNION ALL
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(dup, ", ") + `
	FROM (SELECT ` + columns + `, copies, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour
		FROM ` + duplicates + `
		WHERE ` + analytics.SQLRequest + ` AND cluster = @cluster AND ` + filters + `)
	WHERE {rollup_window}
	UNION ALL
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(raw, ", ") + `
	FROM (SELECT ` + identity + `, ` + columns + `
		FROM {db}.events
		PREWHERE {raw_window}
		WHERE ` + analytics.SQLRequest + ` AND cluster = @cluster AND ` + filters + `
		{dedup})
)`
}()

// The retry-loop rows: version conflicts and successful writes, one row per
// request, each with its writer and object. The tables hold them as
// migration 3's views write them (same expressions, checked by a test); the
// Raw forms derive the same rows from events, for windows that begin before
// loop_epoch and to prove the tables right.
//
// The views add a row per stored copy. A doubled version conflict would
// lengthen its loop and raise its object in the hot-objects ranking, so
// LoopConflictsTable corrects the table's multiset: rows at the instant of
// a duplicated conflict are counted per (writer, object, instant), minus
// copies-1 for each duplicate there, and expanded back to that many rows;
// every other row passes as is. A doubled success is harmless: a second
// success at the same instant splits no run and moves no last success, so
// loop_successes is read as it is.
var (
	LoopConflictsTable = `(
	SELECT ` + loopConflictColumns + ` FROM {db}.loop_conflicts
	WHERE cluster = @cluster AND {window} AND event_time_us NOT IN (SELECT event_time_us FROM ` + duplicateConflicts + `)
	UNION ALL
	SELECT ` + loopConflictColumns + ` FROM (
		SELECT ` + loopConflictColumns + `, sum(k) AS n FROM (
			SELECT ` + loopConflictColumns + `, toInt64(1) AS k FROM {db}.loop_conflicts
			WHERE cluster = @cluster AND {window} AND event_time_us IN (SELECT event_time_us FROM ` + duplicateConflicts + `)
			UNION ALL
			SELECT ` + loopConflictColumns + `, 1 - toInt64(copies) AS k FROM ` + duplicateConflicts + `)
		GROUP BY ` + loopConflictColumns + `
		HAVING n > 0)
	ARRAY JOIN range(toUInt64(n)) AS copy)`
	LoopSuccessesTable = `{db}.loop_successes`
	// LoopConflictsPlain is the table as it is: the same rows as
	// LoopConflictsTable where the window holds no duplicate.
	LoopConflictsPlain = `{db}.loop_conflicts`

	LoopConflictsRaw = `(SELECT audit_id, stage, fingerprint, ` + loopConflictColumns + ` FROM {db}.events
		PREWHERE code = 409
		WHERE {window} AND ` + analytics.SQLRequest + ` AND ` + isWrite + ` AND ` + versionConflict + `
		{dedup})`
	LoopSuccessesRaw = `(SELECT event_date, event_time_us, cluster, ` + loopPair + ` AS pair FROM {db}.events
		PREWHERE {window}
		WHERE ` + analytics.SQLRequest + ` AND ` + isWrite + ` AND ` + isSuccess + `)`
)

const (
	// loopConflictColumns are the columns of loop_conflicts.
	loopConflictColumns = `event_date, cluster, writer, api_group, resource, namespace, name, event_time_us`

	// duplicateConflicts are the duplicated version conflicts of the window.
	duplicateConflicts = `(SELECT ` + loopConflictColumns + `, copies FROM ` + duplicates + `
		WHERE cluster = @cluster AND {window} AND ` + analytics.SQLRequest + ` AND ` + isWrite + ` AND ` + versionConflict + `)`
)

// loopCandidates are the (writer, object) pairs with at least @threshold
// version conflicts in the window, each with its conflicts in time order.
// Only they can hold a loop.
const loopCandidates = `
	SELECT ` + loopPair + ` AS pair, writer, api_group, resource, namespace, name,
		arraySort(groupArray(event_time_us)) AS conflicts_us
	FROM {loop_conflicts}
	WHERE cluster = @cluster AND {window} AND ` + filters + `
	GROUP BY writer, api_group, resource, namespace, name
	HAVING length(conflicts_us) >= @threshold`

// conflictedObjects is one row: objs, the (object hash, version conflicts)
// of every object with a version conflict in the window.
const conflictedObjects = `(
	SELECT groupArray((h, c)) AS objs
	FROM (SELECT ` + objectHash + ` AS h, count() AS c FROM {loop_conflicts} WHERE cluster = @cluster AND {window} AND ` + filters + ` GROUP BY h))`

// Queries, in report order.
var (
	QueryTotals = Query{Name: "totals", Title: "Totals", SQL: `
SELECT toUInt64(sum(requests)), toUInt64(sum(write_attempts)), toUInt64(sum(version_conflicts)), toUInt64(sum(field_conflicts)),
	toUInt64(sum(already_exists)), toUInt64(sum(delete_precondition_conflicts)), toUInt64(sum(stampless_updates)),
	toUInt64(sum(other_conflicts)), toUInt64(sum(gone))
FROM ` + counted}

	QueryConflictsByUser = Query{Name: "conflicts_by_user", Title: "Version conflicts by writer", SQL: `
SELECT writer AS user, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts
FROM ` + counted + `
WHERE write_attempts != 0
GROUP BY user
ORDER BY conflicts DESC, attempts DESC, user ASC
LIMIT @top`}

	QueryConflictsByResource = Query{Name: "conflicts_by_resource", Title: "Version conflicts by resource", SQL: `
SELECT api_group, resource, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts
FROM ` + counted + `
WHERE write_attempts != 0
GROUP BY api_group, resource
ORDER BY conflicts DESC, attempts DESC, api_group ASC, resource ASC
LIMIT @top`}

	// Grouping by a hash of the object, not by its four strings, keeps the
	// per-object aggregation cheap; any() recovers the names. A writer is
	// distinct on an object when one of its counter rows there has a write
	// attempt. Counting distinct writers for every object is most of the
	// cost, and only the contenders need it: the objects with at least as
	// many version conflicts as the @top-th most conflicted one, counted in
	// the small {loop_conflicts} (its rows are exactly the
	// write_version_conflicts). When fewer than @top objects have a
	// conflict, every object contends, so the ranking stays exact.
	QueryHotObjects = Query{Name: "hot_objects", Title: "Hot objects", SQL: `
SELECT any(api_group) AS g, any(resource) AS r, any(namespace) AS ns, any(name) AS n,
	toUInt64(sum(write_attempts)) AS attempts, uniqExact(writer) AS distinct_writers, toUInt64(sum(write_version_conflicts)) AS conflicts
FROM ` + counted + `
WHERE write_attempts != 0 AND (` + objectHash + ` IN (
		SELECT tupleElement(arrayJoin(arrayFilter((o, least) -> tupleElement(o, 2) >= least, objs,
			replicate(arrayReduce('min', arraySlice(arrayReverseSort(arrayMap(o -> tupleElement(o, 2), objs)), 1, @top)), objs))), 1)
		FROM ` + conflictedObjects + `)
	OR (SELECT length(objs) < @top FROM ` + conflictedObjects + `))
GROUP BY ` + objectHash + `
ORDER BY conflicts DESC, distinct_writers DESC, attempts DESC, g, r, ns, n
LIMIT @top`}

	// QueryRetryLoops finds maximal runs of version conflicts by one writer
	// on one object: the run breaks at a success by that writer on that
	// object or at a gap longer than @gap_us. Without window functions the
	// per-pair sequence is an array: each candidate pair's conflicts
	// (loopCandidates) joined with its successes, merged in time order as
	// 2*t+1 and 2*t (a success sorts before a conflict at the same
	// microsecond). Runs start where a conflict follows a success, nothing,
	// or a long gap, and a running sum numbers them; each conflict then
	// becomes a row with its run number, and a GROUP BY measures the runs.
	// A loop is resolved when the writer's last success on the object in
	// the window comes after the loop's last conflict. Only the merged
	// sequence needs sorting: successes enter it unsorted. Current
	// releases refuse a joined subquery without an alias (Code 206), and
	// 18.16 has no setting that relaxes it, so both sides are named.
	QueryRetryLoops = Query{Name: "retry_loops", Title: "Retry loops", SQL: `
SELECT user, api_group, resource, namespace, name,
	count() AS conflicts, min(conflict_us) AS first_us, max(conflict_us) AS last_us, any(last_success) > last_us AS resolved
FROM (
	SELECT user, api_group, resource, namespace, name, last_success,
		arrayJoin(arrayFilter((x, k) -> k = 1, arrayMap((ct, cr) -> (ct, cr), ts, run), kinds)) AS conflict,
		tupleElement(conflict, 1) AS conflict_us, tupleElement(conflict, 2) AS rid
	FROM (
		SELECT writer AS user, api_group, resource, namespace, name,
			arrayReduce('max', successes_us) AS last_success,
			arraySort(arrayConcat(arrayMap(t -> t * 2 + 1, conflicts_us), arrayMap(t -> t * 2, successes_us))) AS seq,
			arrayMap(x -> intDiv(x, 2), seq) AS ts,
			arrayMap(x -> toUInt8(x % 2), seq) AS kinds,
			arrayCumSum(arrayMap((k, pk, t, pt) -> toUInt64(k = 1 AND (pk = 0 OR t - pt > @gap_us)),
				kinds, arrayPushFront(arrayPopBack(kinds), toUInt8(0)), ts, arrayPushFront(arrayPopBack(ts), toUInt64(0)))) AS run
		FROM (` + loopCandidates + `) AS candidates
		ANY LEFT JOIN (
			SELECT pair, groupArray(event_time_us) AS successes_us
			FROM {loop_successes}
			WHERE cluster = @cluster AND pair IN (SELECT pair FROM (` + loopCandidates + `)) AND {window}
			GROUP BY pair
		) AS successes USING pair
	)
)
GROUP BY user, api_group, resource, namespace, name, rid
HAVING conflicts >= @threshold
ORDER BY conflicts DESC, user, api_group, resource, namespace, name, first_us
LIMIT @top`}

	QueryStamplessUpdates = Query{Name: "stampless_updates", Title: "Stampless updates", SQL: `
SELECT writer AS user, api_group, resource, namespace, name, toUInt64(sum(stampless_updates)) AS count
FROM ` + counted + `
WHERE stampless_updates != 0
GROUP BY user, api_group, resource, namespace, name
ORDER BY count DESC, user, api_group, resource, namespace, name
LIMIT @top`}

	// QueryLeaseHolderChanges collapses each lease's non-empty holders, in
	// time order, into runs: every run after the first is a change. holders
	// lists the runs' holders in order, so A -> B -> A lists A, B, A. A
	// copy of an event not merged away yet sorts next to its original
	// (same instant, same holder) and so extends a run without starting
	// one: no dedup needed.
	QueryLeaseHolderChanges = Query{Name: "lease_holder_changes", Title: "Lease holder changes", SQL: `
SELECT namespace, name, toUInt64(length(runs) - 1) AS changes, runs AS holders
FROM (
	SELECT namespace, name,
		arrayMap(x -> tupleElement(x, 2), arraySort(groupArray((event_time_us, lease_holder)))) AS hs,
		arrayFilter((h, p) -> h != p, hs, arrayPushFront(arrayPopBack(hs), '')) AS runs
	FROM {db}.events
	WHERE ` + requests + ` AND api_group = 'coordination.k8s.io' AND resource = 'leases' AND subresource = ''
		AND ` + isWrite + ` AND ` + isSuccess + ` AND lease_holder != ''
	GROUP BY namespace, name
)
WHERE changes > 0
ORDER BY changes DESC, namespace, name
LIMIT @top`}

	// QueryPolicyDecisions counts stampguard's audit annotations. Each value
	// is a JSON array of {"policy","rule","action","path","writer"} objects.
	QueryPolicyDecisions = Query{Name: "policy_decisions", Title: "stampguard policy decisions", SQL: `
SELECT visitParamExtractString(entry, 'policy') AS policy, kind, lower(visitParamExtractString(entry, 'action')) AS action, count() AS count
FROM (
	SELECT arrayJoin(arrayFilter(x -> like(tupleElement(x, 1), '%.stampguard.dev/%'), arrayMap((k, v) -> (k, v), annotation_keys, annotation_values))) AS kv,
		splitByChar('/', tupleElement(kv, 1))[2] AS kind,
		arrayJoin(extractAll(tupleElement(kv, 2), '\\{[^{}]*\\}')) AS entry
	FROM (SELECT ` + identity + `, annotation_keys, annotation_values FROM {db}.events
		PREWHERE notEmpty(annotation_keys)
		WHERE ` + requests + `
		{dedup})
)
GROUP BY policy, kind, action
ORDER BY count DESC, policy, kind, action
LIMIT @top`}
)

// All lists every statement, for the dashboards and for tests that prove
// each one runs.
var All = []Query{
	QueryTotals, QueryConflictsByUser, QueryConflictsByResource, QueryHotObjects,
	QueryRetryLoops, QueryStamplessUpdates, QueryLeaseHolderChanges, QueryPolicyDecisions,
}
