package sql

import (
	"regexp"
	"strconv"
	"strings"
)

// Building blocks, shared by the statements below.
const (
	// requests are the window's requests in events, narrowed.
	requests = Request + ` AND cluster = @cluster AND {events_window} AND {filters}`

	// rateOf is a conflict rate in SQL: conflicts per write attempt, 0
	// without attempts.
	rateOfAttempts = `if(attempts > 0, conflicts / attempts, 0) AS conflict_rate`
)

// identity is the dedup identity of an event. events is a
// ReplacingMergeTree on it, so a copy stored twice by racing writers is
// collapsed only once the parts merge; a raw read keeps one row per
// identity itself (distinctEvents).
const identity = `cluster, audit_id, stage, fingerprint`

// The correction for events stored more than once (migration 4): the
// source of {duplicates}, and the region {duplicated} … {end_duplicated}
// that a binder keeps (the correction applies) or cuts out (the window
// holds no recorded duplicate).
const (
	// corrected is duplicate_events, one row per event with the highest
	// count of copies seen.
	corrected = `{db}.duplicate_events FINAL`
	// noDuplicates reads nothing: for windows without a recorded duplicate.
	noDuplicates = `(SELECT * FROM {db}.duplicate_events LIMIT 0)`
)

// distinctEvents reads columns from the events that pass prewhere and
// where, one row per identity. Only an event recorded in duplicate_events
// can have a second copy in events, and duplicate_events holds each such
// event once, whole. So the events whose key no duplicate of the window
// holds are read from events as they are, and the others from
// duplicate_events: no second read of events, and nothing hashed but the
// key. distinctEvents matches by the identity, for reads that PREWHERE
// narrows to a few events; keyedDistinctEvents, for reads of every event,
// by a cheaper key where it may. window is the read's time placeholder;
// it bounds the duplicates too (their event_time and event_time_us are
// their events'). Without the correction the read is the first part
// alone, unfiltered.
func distinctEvents(columns, prewhere, where, window string) string {
	return distinctBy(identityKey, "", columns, prewhere, where, window)
}

// keyedDistinctEvents is distinctEvents matching by {duplicate_key}: the
// identity, or, where the binder has checked that no other event shares a
// duplicate's instant and fingerprint (Report.InstantKeyCollisions), those
// two numbers, which cost far less to read than the audit ID (a raw read
// reads its columns for whole day partitions: events is sorted by object).
// The read's SQL carries its number in keyedReads for that check.
func keyedDistinctEvents(columns, prewhere, where, window string) string {
	keyedReads = append(keyedReads, keyedRead{prewhere: prewhere, window: window})
	return distinctBy("{duplicate_key}", "/*keyed read "+strconv.Itoa(len(keyedReads)-1)+"*/", columns, prewhere, where, window)
}

// distinctBy is distinctEvents matching by key, with mark (a comment)
// beside the match.
func distinctBy(key, mark, columns, prewhere, where, window string) string {
	return `(
	SELECT ` + columns + ` FROM {db}.events
	PREWHERE ` + prewhere + `
	WHERE ` + where + `{duplicated}` + mark + ` AND (` + key + `) NOT IN (SELECT ` + key + ` FROM {duplicates} WHERE ` + window + `)
	UNION ALL
	SELECT ` + columns + ` FROM {duplicates}
	WHERE ` + window + ` AND ` + prewhere + ` AND ` + where + `{end_duplicated})`
}

// keyedReads are the raw reads of keyedDistinctEvents, by number: the SQL of
// each carries its number in a comment (keyedReadRef), so that a binder
// can tell which rows a bound statement matches to duplicates by key
// (Report.InstantKeyCollisions).
var keyedReads []keyedRead

// keyedRead is where a raw read reads: its PREWHERE and time placeholder
// (its WHERE narrows further).
type keyedRead struct{ prewhere, window string }

var keyedReadRef = regexp.MustCompile(`/\*keyed read ([0-9]+)\*/`)

// The keys a raw read matches events to their recorded duplicates by.
const (
	identityKey = identity
	instantKey  = `event_time_us, fingerprint`
)

// counted is the window's requests as counter rows: request_rollup's
// hours, corrected for duplicates, UNION ALL one row per raw event of the
// edges, each times its edge's sign ({raw_sign}): +1 for the parts of the
// window outside the hours, -1 for the parts of the hours outside the
// window (where a binder reads an hour that cuts the window whole). The
// parts together make the window, so the sums are exact; a single row may
// be negative, so sum the counters (Int64) before judging them, and
// convert the sums back with toUInt64.
//
// The rollup's views count every stored copy of an event, so for each event
// stored copies > 1 times in the rollup's hours a third part adds its
// counters times -(copies - 1), computed from its columns with the same
// definitions as the views. The raw part reads events, where a copy may not
// be merged away yet, so it keeps one row per identity.
var counted = func() string {
	var names, raw, dup []string
	for _, c := range Counters {
		names = append(names, "toInt64(rr."+c.Name+") AS "+c.Name)
		raw = append(raw, "toInt64("+c.Cond+") * edge_sign AS "+c.Name)
		dup = append(dup, "toInt64("+c.Cond+") * (1 - toInt64(copies)) AS "+c.Name)
	}
	columns := `writer, api_group, resource, namespace, name, verb, code, stamp, ` + ConflictClass + ` AS class, ` + IsWrite + ` AS is_write`
	return `(
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(names, ", ") + `
	FROM {db}.request_rollup AS rr
	WHERE cluster = @cluster AND {rollup_window} AND {filters}
	UNION ALL
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(dup, ", ") + `
	FROM (SELECT ` + columns + `, copies, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour
		FROM {duplicates}
		WHERE ` + Request + ` AND cluster = @cluster AND {filters})
	WHERE {rollup_window}
	UNION ALL
	SELECT api_group, resource, namespace, name, writer, ` + strings.Join(raw, ", ") + `
	FROM ` + keyedDistinctEvents(columns+`, {raw_sign} AS edge_sign`, `{raw_window}`, Request+` AND cluster = @cluster AND {filters}`, `{raw_window}`) + `
)`
}()

// classified is the window's requests in events with their class and
// is_write, for series (buckets narrower than the rollup's hours) and
// columns the rollup lacks.
//
// It keeps one row per identity, as the report's raw reads do.
var classified = keyedDistinctEvents(
	`event_time, user_agent, resource, verb, code, stamp, latency_us, `+ConflictClass+` AS class, `+IsWrite+` AS is_write`,
	`{events_window}`, Request+` AND cluster = @cluster AND {filters}`, `{events_window}`)

// The retry-loop rows: version conflicts and successful writes, one row per
// request, each with its writer and object. The tables hold them as
// migration 3's views write them; the raw forms derive the same rows from
// events, for windows that begin before loop_epoch and to prove the tables
// right.
//
// The views add a row per stored copy. A doubled version conflict would
// lengthen its loop and raise its object in the hot-objects ranking, so
// loopConflictsTable corrects the table's multiset: the window's rows are
// counted per (writer, object, instant), minus copies-1 for each duplicate
// there, and expanded back to that many rows. One GROUP BY over the
// window's conflicts (a small table: version conflicts only) costs less on
// 18.16 than reading the duplicates three times to group only the
// duplicated instants. A doubled success is harmless: a second
// success at the same instant splits no run and moves no last success, so
// loop_successes is read as it is.
const (
	loopConflictsTable = `(
	SELECT ` + loopConflictColumns + ` FROM (
		SELECT ` + loopConflictColumns + `, sum(k) AS n FROM (
			SELECT ` + loopConflictColumns + `, toInt64(1) AS k FROM {db}.loop_conflicts
			WHERE cluster = @cluster AND {window}
			UNION ALL
			SELECT ` + loopConflictColumns + `, 1 - toInt64(copies) AS k FROM ` + duplicateConflicts + `)
		GROUP BY ` + loopConflictColumns + `
		HAVING n > 0)
	ARRAY JOIN range(toUInt64(n)) AS copy)`
	loopSuccessesTable = `{db}.loop_successes`
	// loopConflictsPlain is the table as it is: the same rows as
	// loopConflictsTable where the window holds no duplicate.
	loopConflictsPlain = `{db}.loop_conflicts`

	loopSuccessesRaw = `(SELECT event_date, event_time_us, cluster, ` + LoopPair + ` AS pair FROM {db}.events
		PREWHERE {events_window}
		WHERE ` + Request + ` AND ` + IsWrite + ` AND ` + IsSuccess + `)`

	// loopConflictColumns are the columns of loop_conflicts.
	loopConflictColumns = `event_date, cluster, writer, api_group, resource, namespace, name, event_time_us`

	// duplicateConflicts are the duplicated version conflicts of the window.
	duplicateConflicts = `(SELECT ` + loopConflictColumns + `, copies FROM {duplicates}
		WHERE cluster = @cluster AND {window} AND ` + Request + ` AND ` + IsWrite + ` AND ` + VersionConflict + `)`
)

// loopConflictsRaw derives loop_conflicts' rows from events, one per
// request.
var loopConflictsRaw = distinctEvents(loopConflictColumns, `code = 409`,
	`{events_window} AND `+Request+` AND `+IsWrite+` AND `+VersionConflict, `{events_window}`)

// loopConflictsRawUncorrected is loopConflictsRaw without the correction
// for duplicates: every stored copy.
var loopConflictsRawUncorrected = correction(loopConflictsRaw, false)

// loopCandidates are the (writer, object) pairs with at least @threshold
// version conflicts in the window, each with its conflicts in time order.
// Only they can hold a loop.
const loopCandidates = `
	SELECT ` + LoopPair + ` AS pair, writer, api_group, resource, namespace, name,
		arraySort(groupArray(event_time_us)) AS conflicts_us
	FROM {loop_conflicts}
	WHERE cluster = @cluster AND {window} AND {filters}
	GROUP BY writer, api_group, resource, namespace, name
	HAVING length(conflicts_us) >= @threshold`

// uncorrectedLoopCandidates are loopCandidates counted without the
// correction for duplicates ({loop_conflicts_uncorrected}): a superset of
// them, as a copy only adds conflicts. It narrows the successes a loop
// candidate may join, where a superset is as good and much cheaper on
// 18.16, which runs an IN subquery's query more than once.
var uncorrectedLoopCandidates = strings.ReplaceAll(loopCandidates, "{loop_conflicts}", "{loop_conflicts_uncorrected}")

// conflictedObjects is one row: objs, the (object hash, version conflicts)
// of every object with a version conflict in the window.
const conflictedObjects = `(
	SELECT groupArray((h, c)) AS objs
	FROM (SELECT ` + ObjectHash + ` AS h, count() AS c FROM {loop_conflicts} WHERE cluster = @cluster AND {window} AND {filters} GROUP BY h))`

// fewConflictedObjects says that fewer than @top objects have a version
// conflict in the window. A copy adds rows only to an object that has a
// conflict, so the uncorrected rows name the same objects, cheaper.
const fewConflictedObjects = `(SELECT uniqExact(` + ObjectHash + `) < @top FROM {loop_conflicts_uncorrected} WHERE cluster = @cluster AND {window} AND {filters})`

// Parameter and window lists the statements share.
var (
	filtered    = []Param{Cluster, Namespace, Resource, User, Name}
	countedTime = []Window{RollupHours, RawEdges}
)

func with(ps []Param, more ...Param) []Param {
	return append(append([]Param{}, ps...), more...)
}

// The report's statements, in report order.
var (
	Totals = Statement{Name: "totals", Title: "Totals", Shape: Rows,
		Params: filtered, Time: countedTime,
		Columns: []string{"requests", "write_attempts", "version_conflicts", "field_conflicts", "already_exists",
			"delete_precondition_conflicts", "stampless_updates", "other_conflicts", "gone", "conflict_rate"},
		SQL: `
SELECT toUInt64(sum(requests)) AS requests, toUInt64(sum(write_attempts)) AS write_attempts, toUInt64(sum(version_conflicts)) AS version_conflicts,
	toUInt64(sum(field_conflicts)) AS field_conflicts, toUInt64(sum(already_exists)) AS already_exists,
	toUInt64(sum(delete_precondition_conflicts)) AS delete_precondition_conflicts, toUInt64(sum(stampless_updates)) AS stampless_updates,
	toUInt64(sum(other_conflicts)) AS other_conflicts, toUInt64(sum(gone)) AS gone,
	if(write_attempts > 0, version_conflicts / write_attempts, 0) AS conflict_rate
FROM ` + counted}

	ConflictsByUser = Statement{Name: "conflicts_by_user", Title: "Version conflicts by writer", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"user", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT writer AS user, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + counted + `
WHERE write_attempts != 0
GROUP BY user
HAVING attempts > 0
ORDER BY conflicts DESC, attempts DESC, user ASC
LIMIT @top`}

	ConflictsByResource = Statement{Name: "conflicts_by_resource", Title: "Version conflicts by resource", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"api_group", "resource", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT api_group, resource, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + counted + `
WHERE write_attempts != 0
GROUP BY api_group, resource
HAVING attempts > 0
ORDER BY conflicts DESC, attempts DESC, api_group ASC, resource ASC
LIMIT @top`}

	// HotObjects groups by a hash of the object, not by its four strings,
	// which keeps the per-object aggregation cheap; any() recovers the
	// names. A writer is distinct on an object when its write attempts
	// there sum above zero (a counted row may be negative). Counting
	// distinct writers for every object is most of the cost, and only the
	// contenders need it: the objects with at least as many version
	// conflicts as the @top-th most conflicted one, counted in the small
	// {loop_conflicts} (its rows are exactly the write_version_conflicts).
	// When fewer than @top objects have a conflict, every object contends,
	// so the ranking stays exact.
	HotObjects = Statement{Name: "hot_objects", Title: "Hot objects", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{RollupHours, RawEdges, Whole},
		Columns: []string{"g", "r", "ns", "n", "attempts", "distinct_writers", "conflicts", "conflict_rate"},
		SQL: `
SELECT any(wg) AS g, any(wr) AS r, any(wns) AS ns, any(wn) AS n,
	toUInt64(sum(wa)) AS attempts, count() AS distinct_writers, toUInt64(sum(wc)) AS conflicts, ` + rateOfAttempts + `
FROM (
	SELECT ` + ObjectHash + ` AS h, writer, any(api_group) AS wg, any(resource) AS wr, any(namespace) AS wns, any(name) AS wn,
		sum(write_attempts) AS wa, sum(write_version_conflicts) AS wc
	FROM ` + counted + `
	WHERE write_attempts != 0 AND (` + ObjectHash + ` IN (
			SELECT tupleElement(arrayJoin(arrayFilter((o, least) -> tupleElement(o, 2) >= least, objs,
				replicate(arrayReduce('min', arraySlice(arrayReverseSort(arrayMap(o -> tupleElement(o, 2), objs)), 1, @top)), objs))), 1)
			FROM ` + conflictedObjects + `)
		OR ` + fewConflictedObjects + `)
	GROUP BY h, writer
	HAVING wa > 0)
GROUP BY h
ORDER BY conflicts DESC, distinct_writers DESC, attempts DESC, g, r, ns, n
LIMIT @top`}

	// RetryLoops finds maximal runs of version conflicts by one writer on
	// one object: the run breaks at a success by that writer on that object
	// or at a gap longer than @gap_us. Without window functions the
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
	RetryLoops = Statement{Name: "retry_loops", Title: "Retry loops", Shape: Rows,
		Params: with(filtered, Top, GapUs, Threshold), Time: []Window{Whole},
		Columns: []string{"user", "api_group", "resource", "namespace", "name", "conflicts", "first_us", "last_us", "resolved"},
		SQL:     retryLoops}

	StamplessUpdates = Statement{Name: "stampless_updates", Title: "Stampless updates", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"user", "api_group", "resource", "namespace", "name", "count"},
		SQL: `
SELECT writer AS user, api_group, resource, namespace, name, toUInt64(sum(stampless_updates)) AS count
FROM ` + counted + `
WHERE stampless_updates != 0
GROUP BY user, api_group, resource, namespace, name
HAVING count > 0
ORDER BY count DESC, user, api_group, resource, namespace, name
LIMIT @top`}

	// LeaseHolderChanges collapses each lease's non-empty holders, in time
	// order, into runs: every run after the first is a change. holders
	// lists the runs' holders in order, so A -> B -> A lists A, B, A. A
	// copy of an event not merged away yet sorts next to its original
	// (same instant, same holder) and so extends a run without starting
	// one: no dedup needed.
	LeaseHolderChanges = Statement{Name: "lease_holder_changes", Title: "Lease holder changes", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{EventsWhole},
		Columns: []string{"namespace", "name", "changes", "holders"},
		SQL: `
SELECT namespace, name, toUInt64(length(runs) - 1) AS changes, runs AS holders
FROM (
	SELECT namespace, name,
		arrayMap(x -> tupleElement(x, 2), arraySort(groupArray((event_time_us, lease_holder)))) AS hs,
		arrayFilter((h, p) -> h != p, hs, arrayPushFront(arrayPopBack(hs), '')) AS runs
	FROM {db}.events
	WHERE ` + requests + ` AND api_group = 'coordination.k8s.io' AND resource = 'leases' AND subresource = ''
		AND ` + IsWrite + ` AND ` + IsSuccess + ` AND lease_holder != ''
	GROUP BY namespace, name
)
WHERE changes > 0
ORDER BY changes DESC, namespace, name
LIMIT @top`}

	// PolicyDecisions counts stampguard's audit annotations. Each value is
	// a JSON array of {"policy","rule","action","path","writer"} objects.
	PolicyDecisions = Statement{Name: "policy_decisions", Title: "stampguard policy decisions", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{EventsWhole},
		Columns: []string{"policy", "kind", "action", "count"},
		SQL: `
SELECT policy, kind, action, count() AS count
FROM ` + decisions + `
GROUP BY policy, kind, action
ORDER BY count DESC, policy, kind, action
LIMIT @top`}
)

// decisions are the window's stampguard decisions, one row per annotation
// entry: policy, kind (the rule kind, from the annotation key), action.
var decisions = `(
	SELECT visitParamExtractString(entry, 'policy') AS policy, kind, lower(visitParamExtractString(entry, 'action')) AS action, event_time
	FROM (
		SELECT event_time, arrayJoin(arrayFilter(x -> like(tupleElement(x, 1), '%.stampguard.dev/%'), arrayMap((k, v) -> (k, v), annotation_keys, annotation_values))) AS kv,
			splitByChar('/', tupleElement(kv, 1))[2] AS kind,
			arrayJoin(extractAll(tupleElement(kv, 2), '\\{[^{}]*\\}')) AS entry
		FROM ` + distinctEvents(`event_time, annotation_keys, annotation_values`, `notEmpty(annotation_keys)`, requests, `{events_window}`) + `
	)
)`

var retryLoops = `
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
			WHERE cluster = @cluster AND pair IN (SELECT pair FROM (` + uncorrectedLoopCandidates + `)) AND {window}
			GROUP BY pair
		) AS successes USING pair
	)
)
GROUP BY user, api_group, resource, namespace, name, rid
HAVING conflicts >= @threshold
ORDER BY conflicts DESC, user, api_group, resource, namespace, name, first_us
LIMIT @top`

// ReportStatements lists the report's statements, in report order.
var ReportStatements = []Statement{
	Totals, ConflictsByUser, ConflictsByResource, HotObjects,
	RetryLoops, StamplessUpdates, LeaseHolderChanges, PolicyDecisions,
}
