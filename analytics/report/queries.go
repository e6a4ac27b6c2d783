package report

import "strings"

// The analytics SQL is defined here once. The report runs it with the window
// as bound parameters; the dashboards and alert rules run the same
// statements with Grafana's time macros in place of {window}. Every
// statement runs on ClickHouse 18.16 and on current releases: no window
// functions, no JSONExtract, no toStartOfInterval.
//
// Placeholders: {db} is the database, {window} the time filter. Bound
// parameters (client-side, quoted by the driver): @cluster, @namespace,
// @resource, @user (empty means any), @top, @gap_us, @threshold.

// Query is one named analytics statement.
type Query struct {
	Name  string
	Title string
	SQL   string
}

// Render fills in the database and the time filter.
func (q Query) Render(db, window string) string {
	return strings.NewReplacer("{db}", db, "{window}", window).Replace(q.SQL)
}

// ReportWindow is the report's half-open window [@since_us, @until_us) on
// the stage timestamp in microseconds, with the day partitions it spans so
// that ClickHouse reads only those.
const ReportWindow = `event_date >= toDate(toDateTime(intDiv(@since_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@until_us, 1000000))) AND event_time_us >= @since_us AND event_time_us < @until_us`

// Building blocks, shared by the statements below.
const (
	// requests selects each request once: its ResponseComplete event, or
	// its Panic event. dryRun requests are excluded everywhere.
	requests = `stage IN ('ResponseComplete', 'Panic') AND dry_run = 0 AND cluster = @cluster AND {window}
		AND (@namespace = '' OR namespace = @namespace) AND (@resource = '' OR resource = @resource) AND (@user = '' OR writer = @user)`

	// isWrite: a write attempt; the review APIs store nothing.
	isWrite = `verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')`

	// optimisticLock is the apiserver's message for a stale resourceVersion.
	optimisticLock = `the object has been modified; please apply your changes to the latest version and try again`

	// conflictClass sorts every 409 into exactly one class.
	conflictClass = `multiIf(code != 409, '',
		has(cause_reasons, 'FieldManagerConflict'), 'field',
		reason = 'AlreadyExists', 'already_exists',
		reason = 'Conflict' AND position(message, '` + optimisticLock + `') > 0, 'version',
		reason = 'Conflict' AND verb IN ('delete', 'deletecollection') AND match(message, '(UID|ResourceVersion) in the precondition .* does not match'), 'delete_precondition',
		'other')`

	isSuccess = `code >= 200 AND code < 300`

	// versionConflict is class 'version' of conflictClass, on its own: a
	// cheap filter for queries that need only version conflicts.
	versionConflict = `code = 409 AND reason = 'Conflict' AND NOT has(cause_reasons, 'FieldManagerConflict') AND position(message, '` + optimisticLock + `') > 0`

	// classified is the request set with its conflict class.
	classified = `(SELECT writer, api_group, resource, namespace, name, verb, code, stamp, event_time_us, ` + conflictClass + ` AS class
		FROM {db}.events WHERE ` + requests + `)`
)

// Queries, in report order.
var (
	QueryTotals = Query{Name: "totals", Title: "Totals", SQL: `
SELECT
	count() AS requests,
	countIf(` + isWrite + `) AS write_attempts,
	countIf(class = 'version') AS version_conflicts,
	countIf(class = 'field') AS field_conflicts,
	countIf(class = 'already_exists') AS already_exists,
	countIf(class = 'delete_precondition') AS delete_precondition_conflicts,
	countIf(verb = 'update' AND ` + isSuccess + ` AND stamp = '') AS stampless_updates,
	countIf(class = 'other') AS other_conflicts,
	countIf(code = 410) AS gone
FROM ` + classified}

	QueryConflictsByUser = Query{Name: "conflicts_by_user", Title: "Version conflicts by writer", SQL: `
SELECT writer AS user, count() AS write_attempts, countIf(class = 'version') AS version_conflicts
FROM ` + classified + `
WHERE ` + isWrite + `
GROUP BY user
ORDER BY version_conflicts DESC, write_attempts DESC, user ASC
LIMIT @top`}

	QueryConflictsByResource = Query{Name: "conflicts_by_resource", Title: "Version conflicts by resource", SQL: `
SELECT api_group, resource, count() AS write_attempts, countIf(class = 'version') AS version_conflicts
FROM ` + classified + `
WHERE ` + isWrite + `
GROUP BY api_group, resource
ORDER BY version_conflicts DESC, write_attempts DESC, api_group ASC, resource ASC
LIMIT @top`}

	// Grouping by a hash of the object, not by its four strings, keeps the
	// per-object aggregation cheap; any() recovers the names.
	QueryHotObjects = Query{Name: "hot_objects", Title: "Hot objects", SQL: `
SELECT any(api_group) AS g, any(resource) AS r, any(namespace) AS ns, any(name) AS n,
	count() AS write_attempts, uniqExact(writer) AS distinct_writers, countIf(class = 'version') AS version_conflicts
FROM ` + classified + `
WHERE ` + isWrite + `
GROUP BY cityHash64(api_group, resource, namespace, name)
ORDER BY version_conflicts DESC, distinct_writers DESC, write_attempts DESC, g, r, ns, n
LIMIT @top`}

	// QueryRetryLoops finds maximal runs of version conflicts by one writer
	// on one object: the run breaks at a success by that writer on that
	// object or at a gap longer than @gap_us. Without window functions the
	// per-object sequence is an array: runs start where a conflict follows
	// a success, nothing, or a long gap, and a running sum numbers them.
	QueryRetryLoops = Query{Name: "retry_loops", Title: "Retry loops", SQL: `
SELECT user, api_group, resource, namespace, name,
	length(loop_ts) AS conflicts, loop_ts[1] AS first_us, loop_ts[-1] AS last_us,
	arrayExists((t, k) -> k = 0 AND t > last_us, ts, kinds) AS resolved
FROM (
	SELECT user, api_group, resource, namespace, name, ts, kinds, run,
		arrayJoin(arrayDistinct(arrayFilter((r, k) -> k = 1, run, kinds))) AS rid,
		arrayFilter((t, r, k) -> r = rid AND k = 1, ts, run, kinds) AS loop_ts
	FROM (
		SELECT user, api_group, resource, namespace, name, ts, kinds,
			arrayCumSum(arrayMap((k, pk, t, pt) -> toUInt64(k = 1 AND (pk = 0 OR t - pt > @gap_us)),
				kinds, arrayPushFront(arrayPopBack(kinds), toUInt8(0)), ts, arrayPushFront(arrayPopBack(ts), toUInt64(0)))) AS run
		FROM (
			SELECT writer AS user, api_group, resource, namespace, name,
				arraySort(groupArray((event_time_us, toUInt8(class = 'version')))) AS seq,
				arrayMap(x -> tupleElement(x, 1), seq) AS ts,
				arrayMap(x -> tupleElement(x, 2), seq) AS kinds
			FROM ` + classified + `
			WHERE ` + isWrite + ` AND (class = 'version' OR ` + isSuccess + `)
				AND (writer, cityHash64(api_group, resource, namespace, name)) IN (
					SELECT writer, cityHash64(api_group, resource, namespace, name) AS object FROM {db}.events
					WHERE ` + requests + ` AND ` + versionConflict + `
					GROUP BY writer, object HAVING count() >= @threshold)
			GROUP BY user, api_group, resource, namespace, name
		)
	)
)
WHERE conflicts >= @threshold
ORDER BY conflicts DESC, user, api_group, resource, namespace, name, first_us
LIMIT @top`}

	QueryStamplessUpdates = Query{Name: "stampless_updates", Title: "Stampless updates", SQL: `
SELECT writer AS user, api_group, resource, namespace, name, count() AS count
FROM {db}.events
WHERE ` + requests + ` AND verb = 'update' AND ` + isSuccess + ` AND stamp = ''
GROUP BY user, api_group, resource, namespace, name
ORDER BY count DESC, user, api_group, resource, namespace, name
LIMIT @top`}

	// QueryLeaseHolderChanges collapses each lease's non-empty holders, in
	// time order, into runs: every run after the first is a change. holders
	// lists the runs' holders in order, so A -> B -> A lists A, B, A.
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
	FROM {db}.events
	WHERE ` + requests + ` AND notEmpty(annotation_keys)
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
