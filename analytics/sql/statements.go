package sql

import (
	"strings"

	"github.com/stampguard/stampguard/policy/api/annotation"
)

// Building blocks, shared by the statements below.
const (
	// requests are the window's requests in events, narrowed.
	requests = Request + ` AND cluster = @cluster AND {events_window} AND {filters} AND {request_filters}`

	// rateOf is a conflict rate in SQL: conflicts per write attempt, 0
	// without attempts.
	rateOfAttempts = `if(attempts > 0, conflicts / attempts, 0) AS conflict_rate`
)

// Identity is the identity of an event: every read takes one row per
// identity (DistinctEvents), however many copies events holds.
const Identity = `cluster, audit_id, stage, fingerprint`

// The event tables (migration 6). Writers store into EventsTable, sorted
// by hour first; LegacyEventsTable (sorted by object) holds what was
// stored before, and what sinks of older versions store during an
// upgrade. Every read takes both (AllEvents): an event stored in both is
// one identity, so it counts once.
const (
	EventsTable       = "events_by_hour"
	LegacyEventsTable = "events"
)

// DistinctEvents reads columns from the events that pass prewhere and
// where, one row per identity. Both are plain conditions (no subquery:
// 18.16 can hang when the two tables' branches build the same IN set at
// once), applied to each table's read, where the primary key can use
// them. Both event tables are ReplacingMergeTrees on
// the identity, so copies of an event in one table (a redelivery, racing
// writers, an insert retried after it was applied in part) collapse when
// parts merge; until then, and across the two tables, LIMIT 1 BY keeps one.
// Every copy has the same columns: they are one event, decoded by one
// code.
func DistinctEvents(columns, prewhere, where string) string {
	return distinctEvents(columns, prewhere, where, "1")
}

// distinctEvents is DistinctEvents with outer, any condition (one with a
// subquery too), applied to the union of the two tables.
func distinctEvents(columns, prewhere, where, outer string) string {
	return distinct(columns, AllEvents(prewhere, where), outer)
}

// distinct reads columns from events (AllEvents, allEventsIn) that pass
// outer, one row per identity.
func distinct(columns, events, outer string) string {
	return `(
	SELECT ` + columns + ` FROM ` + events + `
	WHERE ` + outer + `
	LIMIT 1 BY ` + Identity + `)`
}

// AllEvents is every stored copy of the events that pass prewhere and
// where (plain conditions, see DistinctEvents), from both event tables: a
// subquery whose columns are the events columns (ClickHouse reads only
// those the outer query names).
//
// A prewhere on the raw edges ({raw_range}) reads events_by_hour's rows
// of their hours only ({raw_hours}): a panel's raw edges are the window
// minus its clean hours, found in the same query, and the key then skips
// the clean hours' granules. The subquery is in that table's read alone:
// 18.16 can hang when both branches build the same set.
func AllEvents(prewhere, where string) string {
	byHour := ""
	if strings.Contains(prewhere, RawRange.Placeholder) {
		byHour = rawHours
	}
	return allEventsIn(prewhere, byHour, where)
}

// allEventsIn is AllEvents with byHour, a condition on events_by_hour's
// key (a set, with a subquery), added to that table's prewhere alone;
// none when it is empty.
func allEventsIn(prewhere, byHour, where string) string {
	hourly := prewhere
	if byHour != "" {
		hourly += ` AND ` + byHour
	}
	return `(
		SELECT * FROM {db}.` + EventsTable + ` PREWHERE ` + hourly + ` WHERE ` + where + `
		UNION ALL
		SELECT * FROM {db}.` + LegacyEventsTable + ` PREWHERE ` + prewhere + ` WHERE ` + where + `)`
}

// rawHours is the placeholder of the hours of the raw edges, on
// events_by_hour's key (AllEvents); "1" where the raw range holds only
// them.
const rawHours = "{raw_hours}"

// HourKey is events_by_hour's hour in its sorting key.
const HourKey = `intDiv(event_time_us, 3600000000)`

// TimeRange is the condition that an event's stage time is in [from,
// until), SQL expressions of Unix microseconds: its UTC day partitions,
// the hours of events_by_hour's key (18.16 derives no key range from a
// condition on event_time_us through intDiv, so the condition names the
// key expression itself), and the time.
func TimeRange(fromUs, untilUs string) string {
	return `event_date >= toDate(toDateTime(intDiv(` + fromUs + `, 1000000)), 'UTC') AND event_date <= toDate(toDateTime(intDiv(` + untilUs + ` - 1, 1000000)), 'UTC')` +
		` AND ` + HourKey + ` >= intDiv(` + fromUs + `, 3600000000) AND ` + HourKey + ` <= intDiv(` + untilUs + ` - 1, 3600000000)` +
		` AND event_time_us >= ` + fromUs + ` AND event_time_us < ` + untilUs
}

// requestColumns are what the counters of a request read, beside its
// object and writer: the aliases class and is_write of Counters.
const requestColumns = `cluster, writer, api_group, resource, namespace, name, verb, code, stamp, ` + ConflictClass + ` AS class, ` + IsWrite + ` AS is_write`

// counterSums are the Counters as aggregates over requestColumns rows.
var counterSums = func() string {
	var cs []string
	for _, c := range Counters {
		cs = append(cs, "toUInt64(countIf("+c.Cond+")) AS "+c.Name)
	}
	return strings.Join(cs, ", ")
}()

// counterValues are the Counters of one requestColumns row.
var counterValues = func() string {
	var cs []string
	for _, c := range Counters {
		cs = append(cs, "toUInt64("+c.Cond+") AS "+c.Name)
	}
	return strings.Join(cs, ", ")
}()

// counterNames are the Counters' column names.
var counterNames = func() string {
	var cs []string
	for _, c := range Counters {
		cs = append(cs, c.Name)
	}
	return strings.Join(cs, ", ")
}()

// The keys of the caches: the counters per object and writer
// (hour_requests, minute_requests), per writer and resource (the writer
// caches), per user agent, writer and namespace (the agent caches); the
// write latencies per writer and namespace (minute_write_latencies).
const (
	objectKeys  = `api_group, resource, namespace, name, writer`
	writerKeys  = `api_group, resource, writer`
	agentKeys   = `api_group, resource, namespace, writer, user_agent`
	latencyKeys = `api_group, resource, namespace, writer`
)

// agentColumns are requestColumns and the user agent.
const agentColumns = requestColumns + `, user_agent`

// counted is the window's requests as counter rows: the clean hours of
// the window from their caches (hour_requests, one version per hour), the
// whole minutes of the clean hours it cuts from their minute caches
// (minute_requests, {minute_window}), and one row per request, read from
// events, for the rest ({raw_window}). Together they are the window, each
// request once.
var counted = counterRows(objectKeys, "hour_requests", "minute_requests", requestColumns).sql()

// countedByWriter is counted without the objects: the request counters
// per writer and resource, the clean hours from the writer caches
// (hour_writer_requests) and the whole minutes of the clean hours the
// window cuts from theirs (minute_writer_requests), the rest from events.
// Only filters on columns it keeps may narrow it (not namespace, not
// name): the report reads it when it can (Report.WriterCaches).
var countedByWriter = counterRows(writerKeys, "hour_writer_requests", "minute_writer_requests",
	`cluster, writer, api_group, resource, verb, code, stamp, `+ConflictClass+` AS class, `+IsWrite+` AS is_write`).sql()

// agentCounted is the window's counter rows per user agent, writer and
// namespace: from the agent caches (hour_agent_requests,
// minute_agent_requests) and events, as counted, when no filter names a
// column they lack (an object's name, a verb, a code); else from events
// alone.
var agentCounted = func() string {
	r := counterRows(agentKeys, "hour_agent_requests", "minute_agent_requests", agentColumns)
	r.filters, r.when = namelessFilters, `(`+unnamed+` AND `+unfilteredRequests+`)`
	return r.sql()
}()

// counterRows are the window's counter rows per keys: from the hour
// caches hours and the minute caches minutes, and from events, whose
// rows carry rawColumns (the keys and what the counters read).
func counterRows(keys, hours, minutes, rawColumns string) splitRows {
	return splitRows{hours: hours, minutes: minutes, cached: keys + `, ` + counterNames, filters: "{filters}",
		rawColumns: rawColumns, raw: keys + `, ` + counterValues, where: Request + ` AND cluster = @cluster AND {filters}`}
}

// splitRows are the rows of a window split as the report's plan splits
// it (PlanReport): the clean whole hours from the hour cache
// ({rollup_window}) and the whole minutes of the clean hours the window
// cuts from the minute cache ({minute_window}), each row selecting cached
// and narrowed by filters; and the rest ({raw_window}) from the events
// that pass where, one row per identity (rawColumns), each selecting raw.
// With when, a condition on constants that says the caches answer the
// query's filters, that split holds only while when does, and the whole
// window is read from events (narrowed by the request filters too)
// otherwise: each branch's gate holds for the whole query or for none
// of it.
type splitRows struct {
	hours, minutes  string // the cache tables
	cached, filters string // what a cache row selects; the caches' filters
	rawColumns, raw string // what an event row reads, and selects
	where           string // the events that are rows
	when            string // the caches' gate; empty: always
}

func (r splitRows) sql() string {
	on := ""
	if r.when != "" {
		on = gate(r.when) + ` AND `
	}
	sql := `(
	SELECT ` + r.cached + `
	FROM {db}.` + r.hours + `
	WHERE ` + on + `cluster = @cluster AND {rollup_window} AND ` + r.filters + `
	UNION ALL
	SELECT ` + r.cached + `
	FROM {db}.` + r.minutes + `
	WHERE ` + on + `cluster = @cluster AND {minute_window} AND ` + r.filters + `
	UNION ALL
	SELECT ` + r.raw + `
	FROM ` + distinctEvents(r.rawColumns, on+`{raw_range}`, r.where, `{raw_window}`)
	if r.when != "" {
		sql += `
	UNION ALL
	SELECT ` + r.raw + `
	FROM ` + DistinctEvents(r.rawColumns, gate(`NOT `+r.when)+` AND {events_window}`, r.where+` AND {request_filters}`)
	}
	return sql + `
)`
}

// The placeholders of the filters a cache that lacks some filters'
// columns answers, and of the condition, on constants, that those it
// lacks select any row: the agent and latency caches keep no name, the
// writer caches neither namespace nor name.
const (
	namelessFilters  = "{nameless_filters}"
	unnamed          = "{unnamed}"
	writerFilters    = "{writer_filters}"
	writerUnfiltered = "{writer_unfiltered}"
)

// cacheFilters are those placeholders, each with the filters it lacks.
var cacheFilters = []struct {
	filters, unfiltered string
	lacks               []Param
}{
	{namelessFilters, unnamed, []Param{Name}},
	{writerFilters, writerUnfiltered, writerLacks},
}

// writerLacks are the filters on columns the writer caches lack.
var writerLacks = []Param{Namespace, Name}

// writerCounted is the placeholder of the window's counter rows in a
// statement that needs neither namespace nor name of them: the report
// binds countedByWriter when it can, every other binder counted.
const writerCounted = "{writer_counted}"

// countedSeries is the window's requests as counter rows with their
// event_time, for the series of counts ({bucket}, buckets of
// @interval_s): seriesCounted.
var countedSeries = seriesCounted("@interval_s")

// seriesCounted is the window's requests as counter rows with their
// event_time, for buckets of width seconds (aligned to the epoch): when
// the buckets are whole minutes and no request filter narrows
// (minuteBuckets), the clean hours from the minute caches
// (minute_requests, each minute as its event_time; a minute lies in one
// bucket) and the rest from events, as counted places them; otherwise the
// whole window from events.
func seriesCounted(width string) string {
	return splitRows{hours: "minute_requests", minutes: "minute_requests",
		cached: `minute AS event_time, ` + counterNames, filters: "{filters}",
		rawColumns: requestColumns + `, event_time`, raw: `event_time, ` + counterValues,
		where: Request + ` AND cluster = @cluster AND {filters}`, when: minuteBuckets(width)}.sql()
}

// minuteBuckets says that buckets of width seconds are whole minutes and
// that no request filter narrows (the minute caches keep neither verb
// nor code), so that whole minutes of the caches make the buckets: a
// condition on constants.
func minuteBuckets(width string) string {
	return `(` + width + ` % 60 = 0 AND ` + unfilteredRequests + `)`
}

// unfilteredRequests is the placeholder of the condition, on constants,
// that no request filter narrows: "1" in the report (it has none).
const unfilteredRequests = "{unfiltered_requests}"

// gate is cond, a condition on constants, and the same on the day
// partitions: 18.16 reads every part under a false constant, and none
// under a day range that a constant empties.
func gate(cond string) string {
	return `(` + cond + ` AND event_date >= if(` + cond + `, toDate('1970-01-01'), toDate('2100-01-01')))`
}

// The retry-loop rows: version conflicts and successful writes, one row per
// request, each with its writer and object. LoopConflictRows and
// LoopSuccessRows derive them from events (one row per identity); the
// hour caches hold the same rows for their clean hours. {loop_conflicts}
// and {loop_successes} are both together: the caches for
// {loop_rollup_window} (the clean hours, and the whole minutes of the
// clean hours the window cuts; every reader narrows the rows to {window}),
// events for {raw_window}.
const (
	// loopConflictColumns are the columns of a conflict row.
	loopConflictColumns = `event_date, cluster, writer, api_group, resource, namespace, name, event_time_us`
	// loopSuccessColumns are the columns of a success row: successes are
	// most writes, so they keep only a hash of (writer, object), and a
	// lookup of a few hundred pairs compares integers.
	loopSuccessColumns = `event_date, cluster, pair, event_time_us`
)

// LoopConflictRows are the version conflicts of events in window (a
// condition on events' columns) within span (a plain range that holds
// it: DistinctEvents' prewhere), one row per request.
func LoopConflictRows(span, window string) string {
	return conflictRowsOf(loopConflictColumns, span, window)
}

// conflictRowsOf are columns of the version conflicts on writes of events
// in window within span, one row per request: the one definition the
// retry loops' rows and conflict_causes' rows share.
func conflictRowsOf(columns, span, window string) string {
	return distinctEvents(columns, `code = 409 AND `+span, Request+` AND `+IsWrite+` AND `+VersionConflict, window)
}

// LoopSuccessRows are the successful writes of events in window within
// span, one row per request.
func LoopSuccessRows(span, window string) string {
	return distinctEvents(`event_date, cluster, `+LoopPair+` AS pair, event_time_us`, span,
		Request+` AND `+IsWrite+` AND `+IsSuccess, window)
}

// VersionConflictRows are the version conflicts of events in window
// within span (as LoopConflictRows), one row per request, with what
// conflict_causes reads of them: the stamp the loser sent, its audit ID
// and its verb (rawConflicts).
func VersionConflictRows(span, window string) string {
	return conflictRowsOf(versionConflictColumns, span, window)
}

// versionConflictColumns are the columns of a row of VersionConflictRows.
const versionConflictColumns = `event_date, cluster, api_group, resource, namespace, name, event_time_us, writer, verb, audit_id, stamp`

var (
	loopConflicts = `(
	SELECT ` + loopConflictColumns + ` FROM {db}.hour_loop_conflicts WHERE {loop_rollup_window}
	UNION ALL
	SELECT ` + loopConflictColumns + ` FROM ` + LoopConflictRows(`{raw_range}`, `{raw_window}`) + `)`
	loopSuccesses = `(
	SELECT ` + loopSuccessColumns + ` FROM {db}.hour_loop_successes WHERE {loop_rollup_window}
	UNION ALL
	SELECT ` + loopSuccessColumns + ` FROM ` + LoopSuccessRows(`{raw_range}`, `{raw_window}`) + `)`
)

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

// conflictedObjects is one row: objs, the (object hash, version conflicts)
// of every object with a version conflict in the window.
const conflictedObjects = `(
	SELECT groupArray((h, c)) AS objs
	FROM (SELECT ` + ObjectHash + ` AS h, count() AS c FROM {loop_conflicts} WHERE cluster = @cluster AND {window} AND {filters} GROUP BY h))`

// fewConflictedObjects says that fewer than @top objects have a version
// conflict in the window.
const fewConflictedObjects = `(SELECT uniqExact(` + ObjectHash + `) < @top FROM {loop_conflicts} WHERE cluster = @cluster AND {window} AND {filters})`

// Parameter and window lists the statements share.
var (
	filtered = []Param{Cluster, Namespace, Resource, User, Name, HideSystem}
	// requestFiltered are filtered and RequestFilters: a statement that
	// reads events alone.
	requestFiltered = with(filtered, Verb, Code)
	countedTime     = []Window{RollupHours, MinuteSpans, RawEdges, RawRange}
	// seriesTime places the time of a series of counts (countedSeries).
	seriesTime = []Window{RollupHours, MinuteSpans, RawEdges, RawRange, EventsWhole, Bucket}
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
FROM ` + writerCounted}

	ConflictsByUser = Statement{Name: "conflicts_by_user", Title: "Version conflicts by writer", Shape: Rows,
		Params: with(filtered, Top), Time: countedTime,
		Columns: []string{"user", "attempts", "conflicts", "conflict_rate"},
		SQL: `
SELECT writer AS user, toUInt64(sum(write_attempts)) AS attempts, toUInt64(sum(write_version_conflicts)) AS conflicts, ` + rateOfAttempts + `
FROM ` + writerCounted + `
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
FROM ` + writerCounted + `
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
		Params: with(filtered, Top), Time: []Window{RollupHours, MinuteSpans, LoopRollupHours, RawEdges, RawRange, Whole},
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
		Params: with(filtered, Top, GapUs, Threshold), Time: []Window{LoopRollupHours, RawEdges, RawRange, Whole},
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
		Params: with(requestFiltered, Top), Time: []Window{EventsWhole},
		Columns: []string{"namespace", "name", "changes", "holders"},
		SQL: `
SELECT namespace, name, toUInt64(length(runs) - 1) AS changes, runs AS holders
FROM (
	SELECT namespace, name,
		arrayMap(x -> tupleElement(x, 2), arraySort(groupArray((event_time_us, lease_holder)))) AS hs,
		arrayFilter((h, p) -> h != p, hs, arrayPushFront(arrayPopBack(hs), '')) AS runs
	FROM ` + AllEvents(`{events_window}`, requests+` AND api_group = 'coordination.k8s.io' AND resource = 'leases' AND subresource = ''
		AND `+IsWrite+` AND `+IsSuccess+` AND lease_holder != ''`) + `
	GROUP BY namespace, name
)
WHERE changes > 0
ORDER BY changes DESC, namespace, name
LIMIT @top`}

	// PolicyDecisions counts stampguard's audit annotations. Each value is
	// a JSON array of {"policy","rule","action","path","writer"} objects.
	PolicyDecisions = Statement{Name: "policy_decisions", Title: "stampguard policy decisions", Shape: Rows,
		Params: with(requestFiltered, Top), Time: []Window{EventsWhole},
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
		SELECT event_time, arrayJoin(arrayFilter(x -> like(tupleElement(x, 1), '%` + annotation.Match + `%'), arrayMap((k, v) -> (k, v), annotation_keys, annotation_values))) AS kv,
			splitByChar('/', tupleElement(kv, 1))[2] AS kind,
			arrayJoin(extractAll(tupleElement(kv, 2), '\\{[^{}]*\\}')) AS entry
		FROM ` + DistinctEvents(`event_time, annotation_keys, annotation_values`, `notEmpty(annotation_keys)`, requests) + `
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
			WHERE cluster = @cluster AND pair IN (SELECT pair FROM (` + loopCandidates + `)) AND {window}
			GROUP BY pair
		) AS successes USING pair
	)
)
GROUP BY user, api_group, resource, namespace, name, rid
HAVING conflicts >= @threshold
ORDER BY conflicts DESC, user, api_group, resource, namespace, name, first_us
LIMIT @top`

// ReportStatements lists the report's statements on the events, in
// report order.
var ReportStatements = []Statement{
	Totals, ConflictsByUser, ConflictsByResource, HotObjects,
	RetryLoops, StamplessUpdates, LeaseHolderChanges, PolicyDecisions,
}

// HistoryStatements lists the report's findings on the field history, in
// report order; the report runs them on request (they read every version
// of the window's objects).
var HistoryStatements = []Statement{LostUpdates, FieldFights, ConflictCauses, NoopWrites, FieldWriters}
