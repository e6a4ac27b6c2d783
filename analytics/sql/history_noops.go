package sql

// The no-op writes in segments (migration 14). A write stored nothing
// when it shares its version with an earlier write of the object (the
// version's first identity stored it), or is an update whose stamp is
// the version it got back. Cut an object's history rows into segments
// (one per hour): a version's identities within a segment give every
// no-op but one, its first identity in the segment, which is a no-op
// exactly when an earlier segment of the window holds the version too.
// An object's segments follow one another in version order (or meet at
// a version), but for the objects whose segments interleave, read raw
// over the whole window as the field changes read them; so the version
// an earlier segment shares with a segment is the segment's first,
// shared with the segment before it as its last. A segment's record
// (noopRecords) keeps its no-ops by writer, its first and last version,
// and the writer of its first version's first identity, with whether
// that identity is already a no-op of its own.
//
// The compaction of an hour stores its record (hour_object_noops); a
// read takes them for the window's clean hours and computes its other
// hours raw, an hour a segment (noopWritesFrom).

// noopWrites are the window's no-op writes, one row per object and
// writer with its no-ops (n). A placeholder each binder fills with the
// sources its window needs (noopWritesFrom), as fieldChanges.
const noopWrites = "{noop_writes}"

// noopIdentity is a history row's identity as the no-op writes sort it,
// with its writer and whether it is an update whose stamp is the version
// it got back: a copy of a row is the same identity.
const noopIdentity = `(event_time_us, audit_id, stage, fingerprint, CAST(writer AS String), toUInt8(verb = 'update' AND stamp = toString(object_version)))`

// noopColumns are the columns of an object's record in a segment
// (noopRecords, hour_object_noops).
const noopColumns = `min_version, max_version, first_writer, first_counted, noop_writers, noop_counts`

// noopVersions are the identities of each version of an object in each
// segment of the history rows that pass where (seg, an expression of the
// row, is the segment), in order: the first stored the version, unless
// an earlier segment holds it too.
func noopVersions(prewhere, where, seg string) string {
	if prewhere != "" {
		prewhere = `
		PREWHERE ` + prewhere
	}
	return `(
		SELECT ` + historyKey + `, ` + seg + ` AS seg, object_version, arraySort(groupUniqArray(` + noopIdentity + `)) AS ws
		FROM {db}.field_versions` + prewhere + `
		WHERE ` + where + `
		GROUP BY ` + historyKey + `, seg, object_version)`
}

// noopRecords are the records of each object in each segment of the
// history rows that pass where (noopVersions), one row per (object,
// segment): object_hash and noopColumns, the no-ops of the segment's own
// (every identity of a version but its first in the segment, and the
// updates whose stamp is the version they got back) counted by writer.
func noopRecords(where, seg string) string {
	return `(
	SELECT ` + historyKey + `, ` + historyHash + ` AS object_hash, seg, min(object_version) AS min_version, max(object_version) AS max_version,
		argMin(tupleElement(ws[1], 5), object_version) AS first_writer, argMin(tupleElement(ws[1], 6), object_version) AS first_counted,
		groupArrayArray(arrayMap(w -> tupleElement(w, 5), arrayFilter((w, i) -> i > 1 OR tupleElement(w, 6) = 1, ws, arrayEnumerate(ws)))) AS noops,
		arrayDistinct(noops) AS noop_writers,
		arrayMap((w, all) -> toUInt64(countEqual(all, w)), noop_writers, replicate(noops, noop_writers)) AS noop_counts
	FROM ` + noopVersions("", where, seg) + `
	GROUP BY ` + historyKey + `, seg)`
}

// noopWritesFrom are the no-op writes (noopWrites) from the clean hours'
// records (cached), from the history rows of the other hours (raw), or
// both. Without cached, the window is one segment. Each object's records
// are stitched: a segment whose first version is the last of the segment
// before adds its first identity, when not a no-op of its own already.
// The objects of interleaved (SQL of a set of object_hash; none when
// empty), whose segments interleave, are read instead from their rows
// over the whole window, as one segment (GLOBAL, as the field changes).
func noopWritesFrom(cached, raw bool, interleaved string) string {
	if !cached {
		return noopSegmentRows("", `cluster = @cluster AND {window}`)
	}
	records := `
		SELECT ` + historyKey + `, object_hash, ` + hourSeg + ` AS seg, min_version, max_version, CAST(first_writer AS String) AS first_writer,
			first_counted, noop_writers, noop_counts
		FROM {db}.hour_object_noops WHERE cluster = @cluster AND {rollup_window}`
	if raw {
		records += `
		UNION ALL SELECT ` + historyKey + `, object_hash, seg, ` + noopColumns + ` FROM ` + noopRecords(`cluster = @cluster AND {history_raw}`, hourSegment)
	}
	where := ""
	if interleaved != "" {
		where = `
		WHERE object_hash NOT IN ` + interleaved
	}
	stitched := `(
	SELECT api_group, resource, namespace, name, tupleElement(p, 1) AS writer, tupleElement(p, 2) AS n
	FROM (
		SELECT ` + historyKey + `,
			arraySort(groupArray((min_version, seg, max_version, first_writer, first_counted))) AS segs,
			arrayFilter((s, b) -> tupleElement(s, 1) = tupleElement(b, 3) AND tupleElement(s, 5) = 0, arrayPopFront(segs), arrayPopBack(segs)) AS meets,
			arrayConcat(groupArrayArray(arrayMap((w, c) -> (w, c), noop_writers, noop_counts)), arrayMap(s -> (tupleElement(s, 4), toUInt64(1)), meets)) AS ps
		FROM (` + records + `)` + where + `
		GROUP BY ` + historyKey + `)
	ARRAY JOIN ps AS p`
	if interleaved == "" {
		return stitched + `)`
	}
	return stitched + `
	UNION ALL SELECT * FROM ` + noopSegmentRows(historyHash+` GLOBAL IN `+interleaved, `cluster = @cluster AND {window}`) + `)`
}

// noopSegmentRows are the no-op writes of the history rows that pass
// prewhere (none when empty) and where, as one segment: every identity
// of a version but its first, and the updates whose stamp is the version
// they got back, one row each (n = 1).
func noopSegmentRows(prewhere, where string) string {
	return `(
	SELECT api_group, resource, namespace, name, tupleElement(w, 5) AS writer, toUInt64(1) AS n
	FROM ` + noopVersions(prewhere, where, `toUInt64(0)`) + `
	ARRAY JOIN ws AS w, arrayEnumerate(ws) AS i
	WHERE i > 1 OR tupleElement(w, 6) = 1)`
}

// panelNoopWrites are the no-op writes as a panel reads them: its window
// is known only to ClickHouse, so both sources, and the objects whose
// segments interleave found in the same query.
var panelNoopWrites = noopWritesFrom(true, true, rollupSegments.interleaved(windowOrder(rollupSegments, true)))
