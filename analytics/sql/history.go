package sql

import (
	"strconv"
	"strings"
)

// The findings on the field history (field_versions, written by the sink
// from internal/audit's definition of what a write stored): writes that
// stored nothing, who caused whose version conflicts, fields that flap
// between writers, and lost updates. See docs/auditsink.md, "Lost updates".
//
// The versions of one object are ordered by their resourceVersion read as
// an integer (object_version): Kubernetes 1.35 made the versions of
// objects of one resource comparable that way (KEP-5504), and etcd3's
// revisions, which they are, always were. A version that is not a decimal
// integer has no history row at all.
//
// 18.16's lambdas cannot name a column of the row: what a lambda needs
// besides its arguments is passed as one more argument, replicated per
// element (replicate).

// historyRows are the window's field history rows as stored: a copy of
// a row (a redelivery, a racing writer, a retried insert) is the same
// row, and each reader says what a copy does to it (no pass over every
// row to drop copies first): the field changes take one row per version
// (historyVersions), the no-op writes each identity once, and a copy adds
// no writer to a conflict's set of blockers. A reader reads only the
// columns it names.
const historyRows = `(
	SELECT api_group, resource, namespace, name, object_version, event_time_us, audit_id, stage, fingerprint, verb, writer, stamp,
		field_manager, full_view, request_managed, force, apply, created, field_paths, field_hashes
	FROM {db}.field_versions
	WHERE cluster = @cluster AND {window})`

// historyVersions are the window's versions of each object, one row per
// version: the first write that stored it (a no-op write returns the
// version it found, and so shares it). A copy of a row (one identity
// stored twice) is the same version, so the one row per version takes
// one row per identity too. The same rows as segmentVersions of the
// window as one segment, which also sorts by cluster and segment: read
// that way, suggest's field_stability took 0.5 s longer at 10M events.
const historyVersions = `(
	SELECT * FROM ` + historyRows + `
	ORDER BY api_group, resource, namespace, name, object_version, event_time_us, audit_id
	LIMIT 1 BY api_group, resource, namespace, name, object_version)`

// WriteBasis is what a write was based on, as far as a lost update goes:
// stampless (an update without a stamp: it shows no read),
// laundered_stamp (kubectl replace's PUT of a manifest, whose body holds
// no managedFields: the stamp was copied in from a GET just before, not
// read with the content), forced_apply (a server-side apply with force),
// patch (any other patch but an apply), create (a write that created the
// object: a create, or an apply that created it), or the empty string (a stamped update
// of an object as read, or an apply without force: it saw what it
// changed, or could not take a field another manager owns).
const WriteBasis = `multiIf(created = 1, 'create',
		verb = 'update' AND stamp = '', 'stampless',
		verb = 'update' AND field_manager = 'kubectl-replace' AND request_managed = 0, 'laundered_stamp',
		verb = 'patch' AND force = 1, 'forced_apply',
		verb = 'patch' AND apply = 0, 'patch',
		'')`

// fieldChanges are the changes of each object field in the window, one
// row per change: the version that set a value other than the one
// before, who set it (writer, on basis) and who had set the value it
// replaced (prev_writer; empty when that was before the window). A field
// is known at a version that shows it, and absent from a version that
// shows the whole object (full_view): a Scale shows spec.replicas alone,
// and an object written through its Scale alone in the window has the
// changes its Scale writes show.
// A write that created the object sets every field; its own row is no
// change.
//
// removed_added says the change removed an item of a set-like list
// (path ending in [*]) that the replaced change had added; item_removed
// that it removed an item of a keyed list ([name=...]) the replaced change
// had set.
//
// The window's clean hours are read from their caches (hour_field_changes
// and the bounds), its other hours computed raw, an hour a segment, and
// the bounds stitched (history_hours.go); an object whose segments
// interleave is read raw over the whole window. Every step is linear in
// the versions of the object.
//
// fieldChanges is a placeholder that each binder fills with the sources
// the window needs (fieldChangesFrom): a report knows its plan, and reads
// a window without clean hours as one segment, and one without raw hours
// from the caches alone; a panel's window is known only to ClickHouse,
// and reads both. 18.16 spends about 0.1 s analysing each raw
// computation, before reading a row, so what a window does not need is
// left out of its SQL.
const fieldChanges = "{field_changes}"

// fieldChangesFrom are the field changes from the cached segments of
// segs (the clean hours', and blocks of them) and the clean hours'
// cached changes (cached), from the history rows of the other hours
// (raw), or both. Every object is stitched, and the changes of those
// whose segments interleave (segs.interleaved, found in the same query)
// are read instead from their rows over the whole window, as one segment.
func fieldChangesFrom(segs segmentSources, cached, raw bool) string {
	if !cached {
		return `(SELECT ` + changeColumns + ` FROM ` + segmentChanges(segmentVersions(`cluster = @cluster AND {window}`, `toUInt64(0)`), true) + `)`
	}
	records, order := stitchRecords(segs, raw)
	return stitchedWindow(segs, records, segs.interleaved(order))
}

// stitchRecords are the records the stitch reads, of the cached segments
// of segs and, with raw, of the other hours computed raw, an hour a
// segment; and order, what interleavedHashes reads of the same segments.
func stitchRecords(segs segmentSources, raw bool) (records, order string) {
	objects := segs.objects()
	records = `SELECT * FROM ` + segs.records()
	if raw {
		versions := segmentVersions(`cluster = @cluster AND {history_raw}`, hourSegment)
		objects = `(SELECT * FROM ` + objects + `
		UNION ALL SELECT ` + historyKey + `, object_hash, seg, ` + names(objectColumns) + ` FROM ` + objectBounds(versions) + `)`
		records += `
		UNION ALL SELECT * FROM ` + rawRecords(versions)
	}
	return `(` + records + `
		UNION ALL SELECT * FROM ` + absentRecords(objects) + `)`, windowOrder(segs, raw)
}

// windowOrder is what interleavedHashes reads of a window's segments: of
// the cached segments of segs and, with raw, of the other hours computed
// raw, an hour a segment.
func windowOrder(segs segmentSources, raw bool) string {
	if !raw {
		return segs.order()
	}
	return `(SELECT * FROM ` + segs.order() + ` UNION ALL SELECT * FROM ` + rawOrder(`cluster = @cluster AND {history_raw}`) + `)`
}

// cachedFieldChanges are the field changes of a window of clean hours
// alone, whose interleaved objects the report read once beforehand
// (InterleavedObjects): with none, the caches and the stitch are all
// there is to read.
func cachedFieldChanges(segs segmentSources, interleaved []uint64) string {
	records, _ := stitchRecords(segs, false)
	return stitchedWindow(segs, records, hashSet(interleaved))
}

// hashSet is the SQL of a set of object hashes, the empty string for
// none.
func hashSet(hashes []uint64) string {
	if len(hashes) == 0 {
		return ""
	}
	hs := make([]string, len(hashes))
	for i, h := range hashes {
		hs[i] = strconv.FormatUint(h, 10)
	}
	return `(` + strings.Join(hs, ", ") + `)`
}

// stitchedWindow are the clean hours' cached changes, the blocks' of
// segs, and those records stitch, but for the objects of interleaved (SQL
// of a set of object_hash; none when empty), whose changes are read from
// their rows over the whole window, as one segment (GLOBAL: on a
// ClickHouse cluster, the set is built once, by the node the query came
// to).
func stitchedWindow(segs segmentSources, records, interleaved string) string {
	changes := `
		SELECT object_hash, ` + historyKey + `, field, CAST(writer AS String) AS writer, time_us, audit_id, CAST(basis AS String) AS basis,
			CAST(prev_writer AS String) AS prev_writer, prev_time_us, prev_audit_id, removed_added, item_removed
		FROM {db}.hour_field_changes WHERE cluster = @cluster AND {rollup_window}`
	if segs.blocks != "" {
		changes += `
		UNION ALL SELECT object_hash, ` + historyKey + `, field, CAST(writer AS String) AS writer, time_us, audit_id, CAST(basis AS String) AS basis,
			CAST(prev_writer AS String) AS prev_writer, prev_time_us, prev_audit_id, removed_added, item_removed
		FROM {db}.block_field_changes WHERE cluster = @cluster AND ` + segs.blocks
	}
	changes += `
		UNION ALL SELECT object_hash, ` + changeColumns + ` FROM ` + stitchedChanges(records)
	if interleaved == "" {
		return `(
	SELECT ` + changeColumns + ` FROM (` + changes + `))`
	}
	return `(
	SELECT ` + changeColumns + ` FROM (` + changes + `)
	WHERE object_hash NOT IN ` + interleaved + `
	UNION ALL SELECT ` + changeColumns + ` FROM ` + segmentChanges(segmentVersionsOf(historyHash+` GLOBAL IN `+interleaved, `cluster = @cluster AND {window}`, `toUInt64(0)`), true) + `)`
}

// InterleavedObjects are the objects whose clean hours interleave, of a
// plan of clean hours alone (CachesOnly), one object_hash per row: a
// function of the caches the plan pinned, which a report reads once and
// hands to its plan (Interleaved) instead of finding them in each
// statement.
func (r Report) InterleavedObjects() string {
	segs := r.Plan.segments()
	return r.Bind(Statement{SQL: `SELECT object_hash FROM ` + segs.interleaved(segs.order()) + ` ORDER BY object_hash`})
}

// LostCause is the cause of a lost update, the empty string for a change that lost
// nothing: a write that changed a field another writer had set, on a basis
// that shows it had not seen that value (stampless, laundered_stamp,
// forced_apply), or a patch that dropped list items the other writer had
// added (list_replaced).
const LostCause = `multiIf(prev_writer = '' OR prev_writer = writer, '',
		basis IN ('stampless', 'laundered_stamp', 'forced_apply'), basis,
		basis = 'patch' AND ((endsWith(field, '[*]') AND removed_added) OR item_removed), 'list_replaced',
		'')`

// The history findings.
var (
	// NoopWrites counts, per writer, the writes that stored nothing: the
	// apiserver answered with the version it already held, so the write
	// shares its version with the write that stored it (the earliest), or
	// is an update whose stamp is the version it got back. The clean
	// hours' no-ops come from their records (hour_object_noops), the rest
	// from the history rows (history_noops.go).
	NoopWrites = Statement{Name: "noop_writes", Title: "Writes that stored nothing", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"user", "count"},
		SQL: `
SELECT writer AS user, toUInt64(sum(n)) AS count
FROM ` + noopWrites + `
WHERE {filters}
GROUP BY user
ORDER BY count DESC, user
LIMIT @top`}

	// ConflictCauses attributes each version conflict to the successful
	// writes between the stale stamp the loser sent and its 409: the
	// history's writes of the object with a later version that were
	// stored before the conflict's answer. Only conflicts on objects with
	// a history in the window count; one whose blockers the history does
	// not hold (not logged with their responses, or before the window)
	// counts with blocked_by ''.
	//
	// The clean hours' conflicts come with their in-hour blockers and
	// writers' newest versions from their caches, the rest from events
	// and the history rows (history_conflicts.go). The cost is linear in
	// the writes, and in the conflicts times the writers of each object,
	// not in the conflicts times the writes (a hot object has both by the
	// thousand), nor in how far behind the stale stamps are
	// (segmentBlockers).
	ConflictCauses = Statement{Name: "conflict_causes", Title: "Who caused the version conflicts", Shape: Rows,
		Params: with(requestFiltered, Top), Time: []Window{Whole, HistoryRaw, RollupHours, RawRange},
		Columns: []string{"writer", "blocked_by", "conflicts"},
		SQL: `
SELECT writer, blocked_by, toUInt64(count()) AS conflicts
FROM (
	SELECT c_writer AS writer, arrayJoin(if(empty(bs), [''], bs)) AS blocked_by
	FROM (
		SELECT c_writer, conflict_id, groupUniqArrayArray(blockers) AS bs
		FROM ` + conflictBlockers + `
		GROUP BY c_writer, conflict_id))
GROUP BY writer, blocked_by
ORDER BY conflicts DESC, writer, blocked_by
LIMIT @top`}

	// FieldFights are the object fields that changed hands between
	// writers at least @min_handoffs times in the window: a change by
	// another writer than the one who set the value before is a handoff.
	FieldFights = Statement{Name: "field_fights", Title: "Field fights", Shape: Rows,
		Params: with(filtered, Top, MinHandoffs), Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"api_group", "resource", "namespace", "name", "field", "writers", "changes", "handoffs", "first_us", "last_us"},
		SQL: `
SELECT api_group, resource, namespace, name, field, arraySort(groupUniqArray(writer)) AS writers, toUInt64(count()) AS changes,
	toUInt64(countIf(prev_writer != '' AND prev_writer != writer)) AS handoffs, min(time_us) AS first_us, max(time_us) AS last_us
FROM ` + fieldChanges + `
WHERE {filters}
GROUP BY api_group, resource, namespace, name, field
HAVING handoffs >= @min_handoffs AND length(writers) >= 2
ORDER BY handoffs DESC, api_group, resource, namespace, name, field
LIMIT @top`}

	// FieldWriters are the observed owners of fields: per kind, namespace
	// and field path, each writer that changed the field in the window
	// (a change as lost updates and fights count them: a version that set
	// another value than the one before; creations excluded), with its
	// changes, the objects it changed, and its first and last change.
	// The busiest first.
	FieldWriters = Statement{Name: "field_writers", Title: "Field writers", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"api_group", "resource", "namespace", "field", "writer", "changes", "objects", "first_us", "last_us"},
		SQL: `
SELECT api_group, resource, namespace, field, writer, toUInt64(count()) AS changes, toUInt64(uniqExact(name)) AS objects,
	min(time_us) AS first_us, max(time_us) AS last_us
FROM ` + fieldChanges + `
WHERE {filters}
GROUP BY api_group, resource, namespace, field, writer
ORDER BY changes DESC, api_group, resource, namespace, field, writer
LIMIT @top`}

	// LostUpdateCount counts the lost updates of the window, for the
	// alert rule.
	LostUpdateCount = Statement{Name: "lost_update_count", Title: "Lost updates", Shape: Number,
		Params: filtered, Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"lost"},
		SQL: `
SELECT toUInt64(count()) AS lost
FROM ` + fieldChanges + `
WHERE ` + LostCause + ` != '' AND {filters}`}

	// LostUpdatesByNamespace counts the lost updates of the window by
	// namespace and cause, for the sink's gauge (auditsink_lost_updates)
	// that the chart's PrometheusRule alerts on.
	LostUpdatesByNamespace = Statement{Name: "lost_updates_by_namespace", Title: "Lost updates by namespace", Shape: Rows,
		Params: filtered, Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"namespace", "cause", "lost"},
		SQL: `
SELECT namespace, cause, toUInt64(count()) AS lost
FROM (SELECT namespace, ` + LostCause + ` AS cause FROM ` + fieldChanges + ` WHERE {filters})
WHERE cause != ''
GROUP BY namespace, cause
ORDER BY namespace, cause`}

	// LostUpdates are the changes that overwrote another writer's value
	// without having seen it (LostCause).
	LostUpdates = Statement{Name: "lost_updates", Title: "Lost updates", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"api_group", "resource", "namespace", "name", "field", "writer", "overwritten_writer", "cause",
			"audit_id", "overwritten_audit_id", "time_us", "overwritten_time_us"},
		SQL: `
SELECT api_group, resource, namespace, name, field, writer, prev_writer AS overwritten_writer, ` + LostCause + ` AS cause,
	audit_id, prev_audit_id AS overwritten_audit_id, time_us, prev_time_us AS overwritten_time_us
FROM ` + fieldChanges + `
WHERE cause != '' AND {filters}
ORDER BY time_us, api_group, resource, namespace, name, field
LIMIT @top`}
)
