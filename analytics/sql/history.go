package sql

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

// fieldVersions are the window's field history rows, one per identity.
const fieldVersions = `(
	SELECT api_group, resource, namespace, name, object_version, event_time_us, audit_id, verb, writer, stamp,
		field_manager, full_view, request_managed, force, apply, created, field_paths, field_hashes
	FROM {db}.field_versions
	WHERE cluster = @cluster AND {window}
	LIMIT 1 BY cluster, audit_id, stage, fingerprint)`

// historyVersions are the window's versions of each object, one row per
// version: the first write that stored it (a no-op write returns the
// version it found, and so shares it).
const historyVersions = `(
	SELECT * FROM ` + fieldVersions + `
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

// fieldSets are the sets of field values of each object field, one row
// per (object, field, version that shows the field), the hashes sorted.
const fieldSets = `(
	SELECT api_group, resource, namespace, name, field, object_version, arraySort(groupArray(hash)) AS hs
	FROM ` + historyVersions + `
	ARRAY JOIN field_paths AS field, field_hashes AS hash
	GROUP BY api_group, resource, namespace, name, field, object_version)`

// fieldChanges are the changes of each object field in the window, one
// row per change: the version that set a value other than the one
// before, who set it (writer, on basis) and who had set the value it
// replaced (prev_writer; the empty string when that was before the window). A field
// is known at a version that shows it, and absent from a version that
// shows the whole object (full_view): a Scale shows spec.replicas alone.
// A create sets every field; its own row is no change.
//
// removed_added says the change removed an item of a set-like list
// (path ending in [*]) that the replaced change had added; item_removed
// that it removed an item of a keyed list ([name=...]) the replaced change
// had set.
const fieldChanges = `(
SELECT api_group, resource, namespace, name, field, j, if(nsets[j] >= 2, set_at[nsets[j] - 1], 0) AS prev,
	kws[j] AS writer, kts[j] AS time_us, kids[j] AS audit_id, kbases[j] AS basis,
	if(prev > 0, kws[prev], '') AS prev_writer, if(prev > 0, kts[prev], toUInt64(0)) AS prev_time_us, if(prev > 0, kids[prev], '') AS prev_audit_id,
	arrayExists((h, now, before) -> NOT has(now, h) AND NOT has(before, h),
		kvals[prev], replicate(kvals[j], kvals[prev]), replicate(if(prev > 1, kvals[prev - 1], emptyArrayUInt64()), kvals[prev])) AS removed_added,
	position(field, '[name=') > 0 AND empty(kvals[j]) AND notEmpty(kvals[prev]) AS item_removed
FROM (
	SELECT api_group, resource, namespace, name, field,
		arrayMap(v -> tupleElement(v, 1), vers) AS vs,
		arrayMap((v, fv) -> indexOf(fv, v), vs, replicate(fvers, vs)) AS pos,
		arrayMap((p, f) -> toUInt8(p > 0 OR f = 1), pos, arrayMap(v -> tupleElement(v, 2), vers)) AS known,
		arrayFilter((x, k) -> k = 1, arrayMap((p, hs) -> hs[p], pos, replicate(fhs, pos)), known) AS kvals,
		arrayFilter((x, k) -> k = 1, arrayMap(v -> tupleElement(v, 3), vers), known) AS kws,
		arrayFilter((x, k) -> k = 1, arrayMap(v -> tupleElement(v, 4), vers), known) AS kts,
		arrayFilter((x, k) -> k = 1, arrayMap(v -> tupleElement(v, 5), vers), known) AS kids,
		arrayFilter((x, k) -> k = 1, arrayMap(v -> tupleElement(v, 6), vers), known) AS kbases,
		arrayMap((b, v, pv, i) -> toUInt8(b = 'create' OR (i > 1 AND v != pv)),
			kbases, kvals, arrayPushFront(arrayPopBack(kvals), emptyArrayUInt64()), arrayEnumerate(kvals)) AS sets,
		arrayCumSum(sets) AS nsets,
		arrayFilter((i, s) -> s = 1, arrayEnumerate(sets), sets) AS set_at
	FROM (
		SELECT api_group, resource, namespace, name, field, groupArray(object_version) AS fvers, groupArray(hs) AS fhs
		FROM ` + fieldSets + `
		GROUP BY api_group, resource, namespace, name, field
	) AS fields ALL INNER JOIN (
		SELECT api_group, resource, namespace, name,
			arraySort(groupArray((object_version, full_view, writer, event_time_us, audit_id, basis))) AS vers
		FROM (SELECT api_group, resource, namespace, name, object_version, full_view, writer, event_time_us, audit_id, ` + WriteBasis + ` AS basis
			FROM ` + historyVersions + `)
		GROUP BY api_group, resource, namespace, name
	) AS objects USING (api_group, resource, namespace, name)
)
ARRAY JOIN arrayEnumerate(sets) AS j
WHERE sets[j] = 1 AND j > 1 AND kbases[j] != 'create')`

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
	// is an update whose stamp is the version it got back.
	NoopWrites = Statement{Name: "noop_writes", Title: "Writes that stored nothing", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole},
		Columns: []string{"user", "count"},
		SQL: `
SELECT writer AS user, toUInt64(count()) AS count
FROM (
	SELECT api_group, resource, namespace, name, tupleElement(w, 3) AS writer
	FROM (
		SELECT api_group, resource, namespace, name,
			arraySort(groupArray((event_time_us, audit_id, writer, toUInt8(verb = 'update' AND stamp = toString(object_version))))) AS ws
		FROM ` + fieldVersions + `
		GROUP BY api_group, resource, namespace, name, object_version)
	ARRAY JOIN ws AS w, arrayEnumerate(ws) AS i
	WHERE i > 1 OR tupleElement(w, 4) = 1)
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
	ConflictCauses = Statement{Name: "conflict_causes", Title: "Who caused the version conflicts", Shape: Rows,
		Params: with(requestFiltered, Top), Time: []Window{EventsWhole, Whole},
		Columns: []string{"writer", "blocked_by", "conflicts"},
		SQL: `
SELECT writer, blocked_by, toUInt64(uniqExact(conflict_id)) AS conflicts
FROM (
	SELECT c_writer AS writer, conflict_id,
		arrayJoin(if(empty(arrayFilter(b -> b != '', bs)), [''], arrayFilter(b -> b != '', bs))) AS blocked_by
	FROM (
		SELECT c_writer, conflict_id, groupUniqArray(if(h_version > stale AND h_time <= c_time, h_writer, '')) AS bs
		FROM (
			SELECT api_group, resource, namespace, name, writer AS c_writer, audit_id AS conflict_id, toUInt64OrZero(stamp) AS stale, event_time_us AS c_time
			FROM ` + DistinctEvents(`api_group, resource, namespace, name, writer, audit_id, stamp, event_time_us, cluster, stage, fingerprint`,
			`{events_window}`, requests+` AND `+IsWrite+` AND `+VersionConflict) + `
			WHERE stale > 0
		) AS conflicts ALL INNER JOIN (
			SELECT api_group, resource, namespace, name, object_version AS h_version, writer AS h_writer, event_time_us AS h_time
			FROM ` + fieldVersions + `
		) AS writes USING (api_group, resource, namespace, name)
		GROUP BY c_writer, conflict_id))
GROUP BY writer, blocked_by
ORDER BY conflicts DESC, writer, blocked_by
LIMIT @top`}

	// FieldFights are the object fields that changed hands between
	// writers at least three times in the window: a change by another
	// writer than the one who set the value before is a handoff.
	FieldFights = Statement{Name: "field_fights", Title: "Field fights", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole},
		Columns: []string{"api_group", "resource", "namespace", "name", "field", "writers", "changes", "handoffs", "first_us", "last_us"},
		SQL: `
SELECT api_group, resource, namespace, name, field, arraySort(groupUniqArray(writer)) AS writers, toUInt64(count()) AS changes,
	toUInt64(countIf(prev_writer != '' AND prev_writer != writer)) AS handoffs, min(time_us) AS first_us, max(time_us) AS last_us
FROM ` + fieldChanges + `
WHERE {filters}
GROUP BY api_group, resource, namespace, name, field
HAVING handoffs >= 3 AND length(writers) >= 2
ORDER BY handoffs DESC, api_group, resource, namespace, name, field
LIMIT @top`}

	// LostUpdateCount counts the lost updates of the window, for the
	// alert rule.
	LostUpdateCount = Statement{Name: "lost_update_count", Title: "Lost updates", Shape: Number,
		Params: filtered, Time: []Window{Whole},
		Columns: []string{"lost"},
		SQL: `
SELECT toUInt64(count()) AS lost
FROM ` + fieldChanges + `
WHERE ` + LostCause + ` != '' AND {filters}`}

	// LostUpdates are the changes that overwrote another writer's value
	// without having seen it (LostCause).
	LostUpdates = Statement{Name: "lost_updates", Title: "Lost updates", Shape: Rows,
		Params: with(filtered, Top), Time: []Window{Whole},
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
