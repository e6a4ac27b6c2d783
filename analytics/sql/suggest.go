package sql

// What `auditsink suggest` reads to draft ConcurrencyPolicies: who changes
// each field and which of those changes were stampless lost updates (the
// field-owner and stamp drafts, by the definitions of FieldWriters and
// LostUpdates), how each field of each kind and namespace stays put (the
// immutable-field drafts), and which names were deleted and created again
// by another writer (the delete-precondition drafts).
// Both read the same field history and events the report does; see
// docs/suggest.md.

var (
	// FieldOwnership is FieldWriters with each writer's lost updates by a
	// stampless update, in one pass over the field changes: per kind,
	// namespace, field path and writer, the changes, the objects, the
	// first and last, and the stampless lost updates (the writer whose
	// change each erased, its time, audit ID and object).
	FieldOwnership = Statement{Name: "field_ownership", Title: "Field writers and their stampless lost updates", Shape: Rows,
		Params: filtered, Time: []Window{Whole, HistoryRaw, RollupHours},
		Columns: []string{"api_group", "resource", "namespace", "field", "writer", "changes", "objects", "first_us", "last_us",
			"lost_times_us", "lost_audit_ids", "lost_names", "lost_overwritten"},
		SQL: `
SELECT api_group, resource, namespace, field, writer, changes, objects, first_us, last_us,
	arrayMap(x -> tupleElement(x, 1), lost) AS lost_times_us, arrayMap(x -> tupleElement(x, 2), lost) AS lost_audit_ids,
	arrayMap(x -> tupleElement(x, 3), lost) AS lost_names, arrayMap(x -> tupleElement(x, 4), lost) AS lost_overwritten
FROM (
	SELECT api_group, resource, namespace, field, writer, toUInt64(count()) AS changes, toUInt64(uniqExact(name)) AS objects,
		min(time_us) AS first_us, max(time_us) AS last_us,
		arraySort(groupArrayIf((time_us, toString(audit_id), toString(name), toString(prev_writer)), cause = 'stampless')) AS lost
	FROM (SELECT *, ` + LostCause + ` AS cause FROM ` + fieldChanges + ` WHERE {filters})
	GROUP BY api_group, resource, namespace, field, writer)
ORDER BY api_group, resource, namespace, field, writer`}

	// FieldStability is, per kind, namespace and field path, how much the
	// history saw of the field: the objects whose versions show it, the
	// versions that show it, the creations that set it, and the objects
	// of the kind and namespace the history shows whole. A field whose
	// FieldWriters rows are empty never changed in the window.
	FieldStability = Statement{Name: "field_stability", Title: "Fields as the history shows them", Shape: Rows,
		Params: filtered, Time: []Window{Whole},
		Columns: []string{"api_group", "resource", "namespace", "field", "objects", "versions", "created", "kind_objects", "first_us", "last_us"},
		SQL: `
SELECT api_group, resource, namespace, field, objects, versions, created, kind_objects, first_us, last_us
FROM (
	SELECT api_group, resource, namespace, field, toUInt64(uniqExact(name)) AS objects, toUInt64(count()) AS versions,
		toUInt64(countIf(created = 1)) AS created, min(event_time_us) AS first_us, max(event_time_us) AS last_us
	FROM (SELECT api_group, resource, namespace, name, created, event_time_us, arrayDistinct(field_paths) AS fs
		FROM ` + historyVersions + ` WHERE {filters})
	ARRAY JOIN fs AS field
	GROUP BY api_group, resource, namespace, field
) AS seen ALL INNER JOIN (
	SELECT api_group, resource, namespace, toUInt64(uniqExact(name)) AS kind_objects
	FROM ` + historyVersions + `
	WHERE full_view = 1 AND {filters}
	GROUP BY api_group, resource, namespace
) AS kinds USING (api_group, resource, namespace)
ORDER BY api_group, resource, namespace, field`}

	// NameReuse counts, per kind and namespace, the names deleted and then
	// created again by another writer than the one who deleted them: the
	// next successful write of the name after a successful delete is a
	// create by someone else. A delete by name then reaches whichever
	// object holds the name now; a uid precondition keeps it to the one
	// its writer read.
	NameReuse = Statement{Name: "name_reuse", Title: "Names deleted and created again by another writer", Shape: Rows,
		Params: requestFiltered, Time: []Window{EventsWhole},
		Columns: []string{"api_group", "resource", "namespace", "reuses", "names", "deleters", "creators", "first_us", "last_us"},
		SQL: `
SELECT api_group, resource, namespace, toUInt64(count()) AS reuses, toUInt64(uniqExact(name)) AS names,
	arraySort(groupUniqArray(deleter)) AS deleters, arraySort(groupUniqArray(creator)) AS creators,
	min(t) AS first_us, max(t) AS last_us
FROM (
	SELECT api_group, resource, namespace, name, tupleElement(op, 3) AS deleter, tupleElement(nx, 3) AS creator, tupleElement(nx, 1) AS t
	FROM (
		SELECT api_group, resource, namespace, name,
			arraySort(groupArray((toUInt64(event_time_us), toString(verb), toString(writer)))) AS ops
		FROM ` + DistinctEvents(`api_group, resource, namespace, name, verb, writer, event_time_us, `+Identity,
			`{events_window}`, requests+` AND verb IN ('create', 'delete') AND subresource = '' AND name != '' AND `+IsSuccess) + `
		GROUP BY api_group, resource, namespace, name)
	ARRAY JOIN ops AS op, arrayPushBack(arrayPopFront(ops), (toUInt64(0), '', '')) AS nx
	WHERE tupleElement(op, 2) = 'delete' AND tupleElement(nx, 2) = 'create' AND tupleElement(nx, 3) != tupleElement(op, 3))
GROUP BY api_group, resource, namespace
ORDER BY api_group, resource, namespace`}
)

// SuggestStatements are what `auditsink suggest` reads.
var SuggestStatements = []Statement{FieldOwnership, FieldStability, NameReuse}
