package sql

import "strings"

// The field changes in segments (docs/auditsink.md, "Schema", migration
// 11). The changes of a field are read from its
// versions in order: a version whose value differs from the one before
// sets it, and each change replaced the set before it. Cut an object's
// versions into segments (one per hour) and compute each segment alone:
// every change whose previous set lies in the same segment, after the
// segment's first set, comes out as it does from the whole history (its
// value, the value before, the set it replaced and the value before that
// are all in the segment). Only two changes per field and segment depend
// on what came before: the segment's first entry, which is a change when
// its value differs from the last value of an earlier segment, and the
// segment's first set after it, whose previous set may lie in an earlier
// segment. A segment's bounds (fieldBounds) keep what those two need and
// what a later segment needs of this one: the first entry, the first set
// after it, the last set after that, and the last value. Stitching the
// segments in version order (stitchedChanges) gives the rest.
//
// The compaction of an hour stores its segment's changes and bounds
// (hour_field_changes, hour_field_bounds, hour_object_bounds); a read
// takes them for the window's clean hours and computes its other hours
// raw, an hour a segment, whose every set it stitches (rawRecords). The
// stitch is exact when the segments
// of an object follow one another in version order: each segment's
// versions after the last version of the one before, or starting at that
// version when both rows of it show the whole object and the later
// segment's is no create (a no-op write logged an hour after the write
// that stored its version: the same stored object, the same values, and
// the earlier row is the version's). An object whose segments interleave
// (a version logged an hour out of order) is read raw over the whole
// window, as one segment (interleavedHashes).

// historyKey names an object of the field history in any cluster: the
// compaction of an hour caches every cluster's objects.
const historyKey = `cluster, api_group, resource, namespace, name`

// historyHash names an object of the field history in a set (the caches
// keep it as object_hash): the ways of reading an object's changes
// (cached and raw segments stitched, or the whole window for an object
// whose segments interleave) each take or leave an object by it, so two
// objects of one hash are read the same way, whatever that way. On the
// key columns themselves, 18.16 builds the set again for each analysis of
// the query, to select the key's ranges.
const historyHash = `cityHash64(` + historyKey + `)`

// hourSegment is the segment of a row read raw: its hour.
const hourSegment = `toUInt64(intDiv(event_time_us, 3600000000))`

// segmentVersions are the versions of each object in each segment of the
// field history rows that pass where (seg, an expression of the row, is
// the segment), one row per version: the first write that stored it (a
// no-op write returns the version it found, and so shares it). A copy of
// a row (one identity stored twice) is the same version.
//
// The subqueries here nest as little as they can, and the field changes
// read each raw computation as few times as they can: 18.16 spends
// about 0.1 s analysing each, before it reads a row.
func segmentVersions(where, seg string) string {
	return segmentVersionsOf("", where, seg)
}

// segmentVersionsOf is segmentVersions of the rows that pass prewhere
// (read first, and the other columns only of the rows it passes; none
// when empty) and where.
func segmentVersionsOf(prewhere, where, seg string) string {
	if prewhere != "" {
		prewhere = `
	PREWHERE ` + prewhere
	}
	return `(
	SELECT ` + historyKey + `, ` + seg + ` AS seg, object_version, event_time_us, audit_id, verb, writer, stamp,
		field_manager, full_view, request_managed, force, apply, created, field_paths, field_hashes
	FROM {db}.field_versions` + prewhere + `
	WHERE ` + where + `
	ORDER BY ` + historyKey + `, seg, object_version, event_time_us, audit_id
	LIMIT 1 BY ` + historyKey + `, seg, object_version)`
}

// fieldSetsOf are the values of each object field in versions
// (segmentVersions), one row per (object, segment, field, version that
// shows the field): the hashes sorted, with the version's writer, time,
// audit ID and basis. A path shows once in a version but for the items of
// a set-like list ([*]), whose hashes are gathered per distinct path in
// the version's own arrays (multi): no grouping of every field of every
// version, only a pass over the version's list items per distinct list.
func fieldSetsOf(versions string) string {
	return `(
	SELECT ` + historyKey + `, seg, field, object_version, hs, writer, event_time_us AS time_us, audit_id AS id, ` + WriteBasis + ` AS basis,
		arrayMap((o, b) -> o > 1 OR b > 1, arrayEnumerateUniq(field_paths), arrayReverse(arrayEnumerateUniq(arrayReverse(field_paths)))) AS multi,
		arrayFilter((p, m) -> NOT m, field_paths, multi) AS single_paths,
		arrayMap(h -> [h], arrayFilter((h, m) -> NOT m, field_hashes, multi)) AS single_sets,
		arrayFilter((p, m) -> m, field_paths, multi) AS multi_paths,
		arrayFilter((h, m) -> m, field_hashes, multi) AS multi_hashes,
		arrayDistinct(multi_paths) AS lists,
		arrayMap((f, ps, hs) -> arraySort(arrayFilter((h, p, list) -> p = list, hs, ps, replicate(f, hs))),
			lists, replicate(multi_paths, lists), replicate(multi_hashes, lists)) AS list_sets
	FROM ` + versions + `
	ARRAY JOIN arrayConcat(single_paths, lists) AS field, arrayConcat(single_sets, list_sets) AS hs)`
}

// fieldSeqs are the known versions of each field in each segment, one
// row per (object, segment, field): seq, the entries (version, shown,
// hashes, writer, time, audit ID, basis) in version order, a field's own
// rows merged with the object's whole views (where a field without a row
// of its own is absent; a Scale shows spec.replicas alone); kvals their
// values, kbefore the value before each; sets which entries set a value
// (a create, or a value other than the one before), and later which of
// those come after the segment's first entry. set_seq are the sets, each
// with the set before it (set_prev) and the value before that
// (set_prev_before), and set_final whether final (an expression of l, the
// set's later, and n, its rank among the later sets) keeps its change.
// later_sets are the later sets as stitchedChanges reads them (element).
func fieldSeqs(versions, final string) string {
	return `(
	SELECT ` + historyKey + `, seg, field,
		arraySort(x -> (tupleElement(x, 1), tupleElement(x, 2)), arrayConcat(present, whole)) AS seq_all,
		arrayMap(x -> tupleElement(x, 1), seq_all) AS all_vs,
		arrayFilter((x, keep) -> keep, seq_all, arrayMap((t, v, nv) -> t = 1 OR v != nv,
			arrayMap(x -> tupleElement(x, 2), seq_all), all_vs, arrayPushBack(arrayPopFront(all_vs), toUInt64(0)))) AS seq,
		arrayMap(x -> tupleElement(x, 3), seq) AS kvals,
		arrayPushFront(arrayPopBack(kvals), emptyArrayUInt64()) AS kbefore,
		arrayMap((x, v, pv, i) -> toUInt8(tupleElement(x, 7) = 'create' OR (i > 1 AND v != pv)), seq, kvals, kbefore, arrayEnumerate(kvals)) AS sets,
		arrayMap((s, i) -> toUInt8(s = 1 AND i > 1), sets, arrayEnumerate(sets)) AS later,
		arrayFilter((x, s) -> s = 1, seq, sets) AS set_seq,
		arraySlice(arrayPushFront(set_seq, (toUInt64(0), toUInt8(0), emptyArrayUInt64(), '', toUInt64(0), '', '')), 1, length(set_seq)) AS set_prev,
		arraySlice(arrayPushFront(arrayFilter((b, s) -> s = 1, kbefore, sets), emptyArrayUInt64()), 1, length(set_seq)) AS set_prev_before,
		arrayFilter((k, s) -> s = 1, arrayMap((l, n) -> ` + final + `, later, arrayCumSum(later)), sets) AS set_final,
		arrayMap((x, b) -> (tupleElement(x, 3), b, tupleElement(x, 4), tupleElement(x, 5), tupleElement(x, 6), tupleElement(x, 7),
			toUInt8(tupleElement(x, 7) != 'create'), toUInt8(1)), arrayFilter((x, l) -> l = 1, seq, later), arrayFilter((b, l) -> l = 1, kbefore, later)) AS later_sets
	FROM (
		SELECT ` + historyKey + `, seg, field,
			groupArray((object_version, toUInt8(1), hs, toString(writer), time_us, id, basis)) AS present
		FROM ` + fieldSetsOf(versions) + `
		GROUP BY ` + historyKey + `, seg, field
	) AS fields ALL LEFT JOIN (
		SELECT ` + historyKey + `, seg,
			groupArray((object_version, toUInt8(0), emptyArrayUInt64(), toString(writer), event_time_us, audit_id, ` + WriteBasis + `)) AS whole
		FROM ` + versions + `
		WHERE full_view = 1
		GROUP BY ` + historyKey + `, seg
	) AS objects USING (` + historyKey + `, seg))`
}

// changeFlags are removed_added and item_removed of a change from its
// value (vals), the value it replaced (prev_vals) and the value before
// that (prev_before): whether it removed an item of a set-like list that
// the replaced change had added, or an item of a keyed list it had set.
const changeFlags = `toUInt8(arrayExists((h, now, before) -> NOT has(now, h) AND NOT has(before, h), prev_vals, replicate(vals, prev_vals), replicate(prev_before, prev_vals))) AS removed_added,
	toUInt8(position(field, '[name=') > 0 AND empty(vals) AND notEmpty(prev_vals)) AS item_removed`

// changeColumns are the columns of a field change, as every source of
// them gives them (segmentChanges, stitchedChanges, hour_field_changes).
const changeColumns = historyKey + `, field, writer, time_us, audit_id, basis, prev_writer, prev_time_us, prev_audit_id, removed_added, item_removed`

// segmentChanges are the changes of each segment of versions that come
// out as from the whole history: every set after the segment's first set
// after its first entry (later, n > 1), but the creates. With whole,
// the segments are the whole window, and every set but the creates is a
// change (the first set after the first entry replaced the first entry
// if that was a create, else nothing known).
func segmentChanges(versions string, whole bool) string {
	final := `toUInt8(l = 1 AND n > 1)`
	if whole {
		final = `toUInt8(1)`
	}
	return `(
	SELECT ` + historyKey + `, field, tupleElement(cur, 3) AS vals, tupleElement(cur, 4) AS writer, tupleElement(cur, 5) AS time_us,
		tupleElement(cur, 6) AS audit_id, tupleElement(cur, 7) AS basis, tupleElement(prev, 3) AS prev_vals, tupleElement(prev, 4) AS prev_writer,
		tupleElement(prev, 5) AS prev_time_us, tupleElement(prev, 6) AS prev_audit_id, ` + changeFlags + `
	FROM ` + fieldSeqs(versions, final) + `
	ARRAY JOIN set_seq AS cur, set_prev AS prev, set_prev_before AS prev_before, set_final AS final
	WHERE final = 1 AND tupleElement(cur, 7) != 'create')`
}

// boundColumns are the columns of a field's bounds in a segment
// (fieldBounds, hour_field_bounds), with their types: the first entry;
// the first set after it (next, if has_next) with the value before it;
// the last set after that (last_set, if has_last) with the value before
// it; and the last value (end_vals).
var boundColumns = [][2]string{
	{"first_version", "UInt64"}, {"first_vals", "Array(UInt64)"}, {"first_writer", "LowCardinality(String)"},
	{"first_time_us", "UInt64"}, {"first_audit_id", "String"}, {"first_basis", "LowCardinality(String)"},
	{"has_next", "UInt8"}, {"next_vals", "Array(UInt64)"}, {"next_before", "Array(UInt64)"}, {"next_writer", "LowCardinality(String)"},
	{"next_time_us", "UInt64"}, {"next_audit_id", "String"}, {"next_basis", "LowCardinality(String)"},
	{"has_last", "UInt8"}, {"last_set_vals", "Array(UInt64)"}, {"last_set_before", "Array(UInt64)"}, {"last_set_writer", "LowCardinality(String)"},
	{"last_set_time_us", "UInt64"}, {"last_set_audit_id", "String"},
	{"end_vals", "Array(UInt64)"},
}

// fieldBounds are the bounds of each field in each segment of versions
// (boundColumns), one row per (object, segment, field). An index past
// the end of an array reads its default: no next or last set.
func fieldBounds(versions string) string {
	return `(
	SELECT ` + historyKey + `, seg, field,
		tupleElement(seq[1], 1) AS first_version, kvals[1] AS first_vals, tupleElement(seq[1], 4) AS first_writer,
		tupleElement(seq[1], 5) AS first_time_us, tupleElement(seq[1], 6) AS first_audit_id, tupleElement(seq[1], 7) AS first_basis,
		indexOf(later, toUInt8(1)) AS ni, toUInt8(ni > 0) AS has_next, kvals[ni] AS next_vals, kbefore[ni] AS next_before,
		tupleElement(seq[ni], 4) AS next_writer, tupleElement(seq[ni], 5) AS next_time_us, tupleElement(seq[ni], 6) AS next_audit_id,
		tupleElement(seq[ni], 7) AS next_basis,
		if(ni = 0, 0, length(later) + 1 - indexOf(arrayReverse(later), toUInt8(1))) AS li, toUInt8(li > ni) AS has_last,
		kvals[if(has_last, li, 0)] AS last_set_vals, kbefore[if(has_last, li, 0)] AS last_set_before,
		tupleElement(seq[if(has_last, li, 0)], 4) AS last_set_writer, tupleElement(seq[if(has_last, li, 0)], 5) AS last_set_time_us,
		tupleElement(seq[if(has_last, li, 0)], 6) AS last_set_audit_id,
		kvals[-1] AS end_vals
	FROM ` + fieldSeqs(versions, `0`) + `)`
}

// objectColumns are the columns of an object's bounds in a segment
// (objectBounds, hour_object_bounds), with their types: its first and
// last version, whether their rows show the whole object and whether the
// first is a create (for the order of segments, interleaved); its first
// whole view (whole_*, if has_whole), and the first and the last create
// after it (if has_create and has_last_create): a field of the object
// without a row of its own in the segment (not in fields) is absent from
// these, and its record there is made of them (absentRecords).
var objectColumns = [][2]string{
	{"min_version", "UInt64"}, {"max_version", "UInt64"}, {"min_full", "UInt8"}, {"max_full", "UInt8"}, {"min_created", "UInt8"},
	{"has_whole", "UInt8"}, {"whole_version", "UInt64"}, {"whole_writer", "LowCardinality(String)"}, {"whole_time_us", "UInt64"},
	{"whole_audit_id", "String"}, {"whole_basis", "LowCardinality(String)"},
	{"has_create", "UInt8"}, {"next_create_writer", "LowCardinality(String)"}, {"next_create_time_us", "UInt64"}, {"next_create_audit_id", "String"},
	{"has_last_create", "UInt8"}, {"last_create_writer", "LowCardinality(String)"}, {"last_create_time_us", "UInt64"}, {"last_create_audit_id", "String"},
	{"fields", "Array(String)"},
}

// objectBounds are the bounds of each object in each segment of versions
// (object_hash and objectColumns), one row per (object, segment).
func objectBounds(versions string) string {
	return `(
	SELECT ` + historyKey + `, ` + historyHash + ` AS object_hash, seg, min(object_version) AS min_version, max(object_version) AS max_version,
		argMin(full_view, object_version) AS min_full, argMax(full_view, object_version) AS max_full, argMin(created, object_version) AS min_created,
		arraySort(groupArrayIf((object_version, toString(writer), event_time_us, audit_id, ` + WriteBasis + `), full_view = 1)) AS wholes,
		arrayFilter((w, i) -> i > 1 AND tupleElement(w, 5) = 'create', wholes, arrayEnumerate(wholes)) AS creates,
		toUInt8(notEmpty(wholes)) AS has_whole, tupleElement(wholes[1], 1) AS whole_version, tupleElement(wholes[1], 2) AS whole_writer,
		tupleElement(wholes[1], 3) AS whole_time_us, tupleElement(wholes[1], 4) AS whole_audit_id, tupleElement(wholes[1], 5) AS whole_basis,
		toUInt8(notEmpty(creates)) AS has_create, tupleElement(creates[1], 2) AS next_create_writer,
		tupleElement(creates[1], 3) AS next_create_time_us, tupleElement(creates[1], 4) AS next_create_audit_id,
		toUInt8(length(creates) > 1) AS has_last_create, tupleElement(creates[-1], 2) AS last_create_writer,
		tupleElement(creates[-1], 3) AS last_create_time_us, tupleElement(creates[-1], 4) AS last_create_audit_id,
		groupUniqArrayArray(field_paths) AS fields
	FROM ` + versions + `
	GROUP BY ` + historyKey + `, seg)`
}

// names lists columns' names; read lists them as read from a cache
// (LowCardinality columns as String, which a UNION ALL with computed rows
// needs on 18.16, where toString keeps LowCardinality and CAST does not).
func names(cols [][2]string) string {
	var ns []string
	for _, c := range cols {
		ns = append(ns, c[0])
	}
	return strings.Join(ns, ", ")
}

func read(cols [][2]string) string {
	var ns []string
	for _, c := range cols {
		if strings.HasPrefix(c[1], "LowCardinality") {
			ns = append(ns, "CAST("+c[0]+" AS String) AS "+c[0])
			continue
		}
		ns = append(ns, c[0])
	}
	return strings.Join(ns, ", ")
}

// interleaved says, of an object's segments (parallel arrays, sorted by
// first version and segment: mins, maxs, segs, and flags, 1 when the row
// of the first version shows the whole object, 2 when that of the last
// does, 4 when the first is a create), that they do not follow one
// another in version order: a segment starts before the one before it
// ends, or at its last version without both rows of it showing the whole
// object, or with a create, or in an earlier hour. Arrays of numbers:
// grouping tuples costs 18.16 eight times as much.
const interleaved = `arrayExists((pmax, pseg, pflags, nmin, nseg, nflags) -> NOT (nmin > pmax
		OR (nmin = pmax AND nseg > pseg AND bitAnd(pflags, 2) != 0 AND bitAnd(nflags, 1) != 0 AND bitAnd(nflags, 4) = 0)),
	arrayPopBack(maxs), arrayPopBack(segs), arrayPopBack(flags), arrayPopFront(mins), arrayPopFront(segs), arrayPopFront(flags))`

// segmentOrder are interleaved's arrays, from an object's segments
// gathered in any order (the arrays ending in _any).
const segmentOrder = `arraySort((x, m, s) -> (m, s), mins_any, mins_any, segs_any) AS mins,
	arraySort((x, m, s) -> (m, s), maxs_any, mins_any, segs_any) AS maxs,
	arraySort((x, m, s) -> (m, s), segs_any, mins_any, segs_any) AS segs,
	arraySort((x, m, s) -> (m, s), flags_any, mins_any, segs_any) AS flags`

// rawOrder are the bounds of each object in each hour of the field
// history rows that pass where, as interleavedHashes reads them: read in
// one pass, without taking each version's first row, so each flag is the
// one that sends the object raw of the rows of its version (a copy of a
// Scale row beside the whole view, or of a create, counts).
func rawOrder(where string) string {
	return `(
	SELECT ` + historyHash + ` AS object_hash, ` + hourSegment + ` AS seg, min(object_version) AS min_version, max(object_version) AS max_version,
		argMin(full_view, (object_version, full_view)) AS min_full, argMax(full_view, (object_version, 1 - full_view)) AS max_full,
		argMin(created, (object_version, 1 - created)) AS min_created
	FROM {db}.field_versions
	WHERE ` + where + `
	GROUP BY object_hash, seg)`
}

// interleavedHashes are the hashes of the objects of objects (object_hash,
// seg, min_version, max_version, min_full, max_full and min_created)
// whose segments interleave. Most objects' segments are apart: the k-th
// smallest last version below the k+1-th smallest first version, which
// sorting numbers alone shows; only the others are sorted as segments.
func interleavedHashes(objects string) string {
	return `(
	SELECT object_hash FROM (
		SELECT object_hash, ` + segmentOrder + ` FROM (
			SELECT object_hash, groupArray(min_version) AS mins_any, groupArray(max_version) AS maxs_any, groupArray(seg) AS segs_any,
				groupArray(min_full + 2 * max_full + 4 * min_created) AS flags_any
			FROM ` + objects + `
			GROUP BY object_hash)
		WHERE arrayExists((pmax, nmin) -> nmin <= pmax, arrayPopBack(arraySort(maxs_any)), arrayPopFront(arraySort(mins_any))))
	WHERE ` + interleaved + `)`
}

// A record is what the stitch reads of a field in a segment: its first
// entry (first_*), the sets after it (later, each an element), and its
// last value (end_vals). An element is a set as the stitch lists them:
// (vals, before, writer, time, audit ID, basis, emit, present), its
// value, the value before it, who set it when on what basis, whether its
// change is read from the stitch (not from a cache, and not a create),
// and whether the set exists. A segment computed raw lists every later
// set; a cached one its first and its last (the changes between are
// cached).
const recordColumns = `object_hash, first_version, seg, first_vals, first_writer, first_time_us, first_audit_id, first_basis, later, end_vals`

// rawRecords are the records of each field in each segment of versions.
func rawRecords(versions string) string {
	return `(
	SELECT ` + historyKey + `, field, ` + historyHash + ` AS object_hash, tupleElement(seq[1], 1) AS first_version, seg, kvals[1] AS first_vals, tupleElement(seq[1], 4) AS first_writer,
		tupleElement(seq[1], 5) AS first_time_us, tupleElement(seq[1], 6) AS first_audit_id, tupleElement(seq[1], 7) AS first_basis,
		later_sets AS later, kvals[-1] AS end_vals
	FROM ` + fieldSeqs(versions, `0`) + `)`
}

// absentRecords are the records of the fields of each object in the
// segments of objects where the object shows whole and the field has no
// row of its own: absent at the first whole view, set only by the creates
// after it.
func absentRecords(objects string) string {
	return `(
	SELECT ` + historyKey + `, field, object_hash, tupleElement(o, 2) AS first_version, tupleElement(o, 1) AS seg, emptyArrayUInt64() AS first_vals,
		tupleElement(o, 3) AS first_writer, tupleElement(o, 4) AS first_time_us, tupleElement(o, 5) AS first_audit_id, tupleElement(o, 6) AS first_basis,
		arrayFilter(x -> tupleElement(x, 8) = 1, [
			(emptyArrayUInt64(), emptyArrayUInt64(), tupleElement(o, 8), tupleElement(o, 9), tupleElement(o, 10), 'create', toUInt8(0), tupleElement(o, 7)),
			(emptyArrayUInt64(), emptyArrayUInt64(), tupleElement(o, 12), tupleElement(o, 13), tupleElement(o, 14), 'create', toUInt8(0), tupleElement(o, 11))]) AS later,
		emptyArrayUInt64() AS end_vals
	FROM (
		SELECT ` + historyKey + `, object_hash, o, arrayFilter((f, fs) -> NOT has(fs, f), all_fields, replicate(tupleElement(o, 15), all_fields)) AS missing
		FROM (
			SELECT ` + historyKey + `, any(object_hash) AS object_hash, groupUniqArrayArray(fields) AS all_fields,
				groupArrayIf((seg, whole_version, whole_writer, whole_time_us, whole_audit_id, whole_basis, has_create, next_create_writer,
					next_create_time_us, next_create_audit_id, has_last_create, last_create_writer, last_create_time_us, last_create_audit_id, fields), has_whole = 1) AS wholes
			FROM ` + objects + `
			GROUP BY ` + historyKey + `)
		ARRAY JOIN wholes AS o)
	ARRAY JOIN missing AS field)`
}

// stitchSets are the columns of an object field's stitch, of its
// records (historyKey, field and recordColumns) grouped per object field:
// recs, its records in version order, and sets, each segment's first
// entry if that set a value (a create, or a value other than the last one
// before), then its later sets, each an element.
var stitchSets = func() string {
	r := func(i string) string { return "tupleElement(r, " + i + ")" }
	return `
			any(object_hash) AS object_hash,
			arraySort(x -> (tupleElement(x, 1), tupleElement(x, 2)), groupArray((` + strings.TrimPrefix(recordColumns, "object_hash, ") + `))) AS recs,
			arrayPushFront(arrayPopBack(arrayMap(r -> ` + r("9") + `, recs)), emptyArrayUInt64()) AS ends_before,
			arrayFilter(x -> tupleElement(x, 8) = 1, arrayReduce('groupArrayArray', arrayMap((r, eb, i) -> arrayConcat(
				[(` + r("3") + `, eb, ` + r("4") + `, ` + r("5") + `, ` + r("6") + `, ` + r("7") + `, toUInt8(` + r("7") + ` != 'create'),
					toUInt8(` + r("7") + ` = 'create' OR (i > 1 AND ` + r("3") + ` != eb)))], ` + r("8") + `),
				recs, ends_before, arrayEnumerate(recs)))) AS sets`
}()

// stitchedChanges are the changes records give (historyKey, field and
// recordColumns, of every segment of the window), stitched in version
// order per object field: each segment gives, in order, its first entry
// if that set a value (a create, or a value other than the last one
// before), then its later sets; each set replaced the one before it in
// that list, and those marked emit are changes.
func stitchedChanges(records string) string {
	return `(
	SELECT ` + historyKey + `, object_hash, field, tupleElement(cur, 1) AS vals, tupleElement(cur, 3) AS writer, tupleElement(cur, 4) AS time_us,
		tupleElement(cur, 5) AS audit_id, tupleElement(cur, 6) AS basis, tupleElement(prev, 1) AS prev_vals, tupleElement(prev, 2) AS prev_before,
		tupleElement(prev, 3) AS prev_writer, tupleElement(prev, 4) AS prev_time_us, tupleElement(prev, 5) AS prev_audit_id, ` + changeFlags + `
	FROM (
		SELECT ` + historyKey + `, field,` + stitchSets + `,
			arraySlice(arrayPushFront(sets, (emptyArrayUInt64(), emptyArrayUInt64(), '', toUInt64(0), '', '', toUInt8(0), toUInt8(0))), 1, length(sets)) AS prevs
		FROM ` + records + `
		GROUP BY ` + historyKey + `, field)
	ARRAY JOIN sets AS cur, prevs AS prev
	WHERE tupleElement(cur, 7) = 1)`
}
