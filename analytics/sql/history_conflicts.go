package sql

// The version conflicts' blockers in segments (migration 15). A writer
// blocks a version conflict when it stored a version later than the
// stale stamp the loser sent, at or before the conflict's time, in the
// window (segmentBlockers, the window one segment). Cut the window into
// segments, an hour each: the writes at or before a conflict's time are
// those of its own segment up to it, and every write of the window's
// earlier segments. So a writer blocks a conflict when a write of its in
// the conflict's segment does (the in-segment blockers), or when the
// newest version it stored in an earlier segment of the window is later
// than the stale stamp (writerVersions).
//
// The compaction of an hour stores each version conflict of the hour with
// its in-hour blockers (hour_conflict_blockers) and each writer's newest
// version of each object in the hour (hour_writer_versions); a read takes
// them for the window's clean hours and computes its other hours raw, an
// hour a segment (conflictBlockersFrom). Each is a function of its hour's
// rows alone, pinned by the hour's version as every cache is.

// conflictBlockers are conflict_causes' version conflicts of the window
// on objects with a history in the window, one row or more per conflict
// (c_writer, conflict_id) whose blockers together are the writers that
// block it. A placeholder each binder fills with the sources its window
// needs (conflictBlockersFrom), as fieldChanges.
const conflictBlockers = "{conflict_blockers}"

// blockerConflictColumns are the columns of a version conflict as the
// blockers read it: its object, time, stale stamp, writer, verb and audit
// ID.
const blockerConflictColumns = historyKey + `, event_time_us, stale, writer, verb, audit_id`

// rawConflicts are the version conflicts of the events in span (a plain
// condition, read where the tables' keys can use it) that pass outer,
// one row per request (VersionConflictRows), each with its stale stamp
// (0 for none): event_date and blockerConflictColumns.
func rawConflicts(span, outer string) string {
	return `(
	SELECT event_date, ` + historyKey + `, event_time_us, toUInt64OrZero(stamp) AS stale, CAST(writer AS String) AS writer, CAST(verb AS String) AS verb, audit_id
	FROM ` + VersionConflictRows(span, outer) + `)`
}

// segmentBlockers are the blockers of each conflict of conflicts (a table
// of blockerConflictColumns) among the writes of the history rows that
// pass where in its segment (seg, an expression of event_time_us, of a
// row's and of a conflict's). One row per conflict on an object with
// writes in its segment and per writer of those: the conflict's columns,
// c_writer and conflict_id (its writer and audit ID), and blockers, [the
// writer] when it blocks the conflict, [] when not (an empty writer
// blocks nothing).
//
// A writer blocks a conflict when the newest version it had stored by
// the conflict's time is later than the stale stamp. That newest version
// rises only at the writer's tops (rises), so each top's rise over the
// top before it, merged with the object's conflicts' times (sorted by
// time, so that the merge gives their answers in their order) as keys,
// time * 2 for a write and time * 2 + 1 for a conflict, so that a write
// at the conflict's time comes before it, and summed along the merge, is
// at each conflict the newest version stored by then. The cost is linear
// in the writes (with a sort of those of a writer whose versions fall),
// and in the conflicts times the writers of each object, however far
// behind the stale stamps are and in whatever order the versions were
// stored.
func segmentBlockers(conflicts, where, seg string) string {
	return `(
	SELECT ` + historyKey + `, seg, tupleElement(o, 1) AS event_time_us, tupleElement(o, 2) AS stale, tupleElement(o, 3) AS writer,
		tupleElement(o, 4) AS verb, tupleElement(o, 5) AS audit_id, writer AS c_writer, audit_id AS conflict_id,
		if(tupleElement(o, 6) AND h_writer != '', [h_writer], emptyArrayString()) AS blockers
	FROM (
		SELECT ` + historyKey + `, seg, h_writer, arrayMap((c, n) -> (tupleElement(c, 1), tupleElement(c, 2), tupleElement(c, 3), tupleElement(c, 4), tupleElement(c, 5),
			n > tupleElement(c, 2)), cs, stored) AS outcomes
		FROM (
			SELECT ` + historyKey + `, seg, h_writer, cs, ` + rises + ` AS tops, arrayFilter((v, f) -> f, versions, tops) AS top_versions,
				arrayConcat(arrayMap(t -> t * 2, arrayFilter((t, f) -> f, times, tops)), arrayMap(c -> tupleElement(c, 1) * 2 + 1, cs)) AS keys,
				arrayCumSum(arraySort((n, k) -> k, arrayConcat(arrayMap((m, p) -> toUInt64(m - p), top_versions, arrayPushFront(arrayPopBack(top_versions), toUInt64(0))),
					arrayMap(c -> toUInt64(0), cs)), keys)) AS sums,
				arrayFilter((n, k) -> k % 2 = 1, sums, arraySort(keys)) AS stored
			FROM (
				SELECT ` + historyKey + `, seg, h_writer, arrayMap(w -> tupleElement(w, 1), ws) AS times, arrayMap(w -> tupleElement(w, 2), ws) AS versions
				FROM (
					SELECT ` + historyKey + `, ` + seg + ` AS seg, toString(writer) AS h_writer, arraySort(groupArray((event_time_us, object_version))) AS ws
					FROM {db}.field_versions
					WHERE ` + where + `
					GROUP BY ` + historyKey + `, seg, h_writer)) AS writes
			ALL INNER JOIN (
				SELECT ` + historyKey + `, ` + seg + ` AS seg, arraySort(groupArray((event_time_us, stale, writer, verb, audit_id))) AS cs
				FROM ` + conflicts + `
				GROUP BY ` + historyKey + `, seg
			) AS conflicts USING (` + historyKey + `, seg)))
	ARRAY JOIN outcomes AS o)`
}

// rises are, for segmentBlockers' writer, whether each of its writes (its
// times and versions in time order, a copy of a row one more write of the
// same version and time) is a top: a write whose version is at least
// every version the writer stored before it, so that the newest version
// it had stored rises, or stays, there and nowhere else. Where the
// writer's versions rise with its times (one request at a time), every
// write is a top; where they fall somewhere (requests in flight together,
// answered out of order), they are ranked (versionRanks), and a write is
// a top where its rank's distance below the running maximum of the ranks
// before it, carried as arrayCumSumNonNegative carries it (the distance
// before, plus the fall from the rank before: the difference of the
// negated ranks; never below zero), is zero. Ranks, not versions, so
// that the distances fit an Int64 whatever the versions are. The ranks are taken on those rows alone (on the
// others on an empty array), since 18.16 computes both sides of an if.
var rises = `if(` + versionsFall + `, arrayMap(d -> toUInt8(d = 0), arrayCumSumNonNegative(arrayDifference(arrayMap(r -> -toInt64(r),
					` + versionRanks(`if(`+versionsFall+`, versions, emptyArrayUInt64())`) + `)))),
				arrayMap(v -> toUInt8(1), versions))`

// versionsFall is whether a write of segmentBlockers' writer has a lower
// version than the write before it.
const versionsFall = `arrayExists((a, b) -> a > b, arrayPopBack(versions), arrayPopFront(versions))`

// versionRanks is the SQL of the rank of each element of values (an
// expression of an array) among them, 1 for the lowest, equal elements
// in any order: the places sorted by their values, and those sorted by
// themselves give each place its rank. The sorted places are the one
// element of an array that a lambda reads, so that the SQL names them
// once.
func versionRanks(values string) string {
	return `arrayMap(p -> arraySort((k, q) -> q, arrayEnumerate(p), p), [arrayMap(x -> arraySort((i, v) -> v, arrayEnumerate(x), x), [` + values + `])[1]])[1]`
}

// writerVersions are the newest version each writer stored of each
// object in each segment (seg, an expression of a row) of the history
// rows that pass where.
func writerVersions(where, seg string) string {
	return `(
	SELECT ` + historyKey + `, ` + seg + ` AS seg, CAST(writer AS String) AS writer, max(object_version) AS max_version
	FROM {db}.field_versions
	WHERE ` + where + `
	GROUP BY ` + historyKey + `, seg, writer)`
}

// hourConflictBlockers are the version conflicts of the hour of a
// compaction, each once with its in-hour blockers (segmentBlockers, the
// hour one segment; none without a stale stamp, which no reader takes):
// the rows of hour_conflict_blockers.
var hourConflictBlockers = `(
	SELECT ` + blockerConflictColumns + `, arraySort(groupUniqArrayArray(blockers)) AS blockers
	FROM (
		SELECT ` + blockerConflictColumns + `, emptyArrayString() AS blockers FROM ` + rawConflicts(hourRows, "1") + `
		UNION ALL
		SELECT ` + blockerConflictColumns + `, blockers FROM ` + segmentBlockers(`(SELECT * FROM `+rawConflicts(hourRows, "1")+` WHERE stale > 0)`, hourRows, hourSegment) + `)
	GROUP BY ` + blockerConflictColumns + `)`

// windowConflicts narrows version conflicts to conflict_causes': on
// @cluster, in {window}, through its filters, and with a stale stamp.
const windowConflicts = `cluster = @cluster AND {window} AND {filters} AND {request_filters} AND stale > 0`

// conflictBlockersFrom are the conflicts with their blockers
// (conflictBlockers) from the clean hours' caches (cached), from the
// events and history rows of the other hours (raw), or both; the raw
// conflicts are those of the events in span that pass outer
// (rawConflicts). Without cached, the window is one segment.
//
// With the caches, the conflicts of each object and segment meet the
// newest version each writer of the object stored in the window's
// earlier segments (newestBefore; an INNER JOIN with the object's
// writers in every segment of the window, so that a conflict on an object
// without a history in the window is left out): a conflict takes the
// writers whose newest version is later than its stale stamp, besides its
// in-segment blockers, cached for a clean hour, computed raw
// (segmentBlockers, an hour a segment) for the others.
func conflictBlockersFrom(cached, raw bool, span, outer string) string {
	filtered := func(conflicts string) string {
		return `(SELECT *, toUInt16(409) AS code FROM ` + conflicts + ` WHERE ` + windowConflicts + `)`
	}
	if !cached {
		return `(SELECT c_writer, conflict_id, blockers FROM ` + segmentBlockers(filtered(rawConflicts(span, outer)), `cluster = @cluster AND {window}`, `toUInt64(0)`) + `)`
	}
	cachedConflicts := `
		SELECT event_date, ` + historyKey + `, ` + hourSeg + ` AS seg, event_time_us, stale, CAST(writer AS String) AS writer, CAST(verb AS String) AS verb, audit_id, blockers
		FROM {db}.hour_conflict_blockers WHERE cluster = @cluster AND {rollup_window}`
	conflicts := cachedConflicts
	versions := `
		SELECT ` + historyKey + `, ` + hourSeg + ` AS seg, CAST(writer AS String) AS writer, max_version
		FROM {db}.hour_writer_versions WHERE cluster = @cluster AND {rollup_window}`
	inSegment := `
	UNION ALL
	SELECT writer AS c_writer, audit_id AS conflict_id, blockers FROM ` + filtered(`(`+cachedConflicts+`)`) + ` WHERE notEmpty(blockers)`
	if raw {
		conflicts += `
		UNION ALL SELECT event_date, ` + historyKey + `, ` + hourSegment + ` AS seg, event_time_us, stale, writer, verb, audit_id, emptyArrayString() AS blockers
		FROM ` + rawConflicts(span, outer)
		versions += `
		UNION ALL SELECT * FROM ` + writerVersions(`cluster = @cluster AND {history_raw}`, hourSegment)
		inSegment += `
	UNION ALL
	SELECT c_writer, conflict_id, blockers FROM ` + segmentBlockers(filtered(rawConflicts(span, outer)), `cluster = @cluster AND {history_raw}`, hourSegment)
	}
	return `(
	SELECT tupleElement(c, 1) AS c_writer, tupleElement(c, 2) AS conflict_id,
		arrayMap(n -> tupleElement(n, 1), arrayFilter((n, s) -> tupleElement(n, 2) > s, newest, replicate(tupleElement(c, 3), newest))) AS blockers
	FROM (
		SELECT cs, ` + newestBefore + ` AS newest
		FROM (
			SELECT ` + historyKey + `, seg, groupArray((writer, audit_id, stale)) AS cs
			FROM ` + filtered(`(`+conflicts+`)`) + `
			GROUP BY ` + historyKey + `, seg) AS conflicts
		ALL INNER JOIN (
			SELECT ` + historyKey + `, groupArray((seg, writer, max_version)) AS vs
			FROM (` + versions + `)
			WHERE writer != '' AND (` + historyKey + `) IN (SELECT ` + historyKey + ` FROM ` + filtered(`(`+conflicts+`)`) + `)
			GROUP BY ` + historyKey + `
		) AS versions USING (` + historyKey + `))
	ARRAY JOIN cs AS c` + inSegment + `)`
}

// newestBefore is, for the conflicts of an object in segment seg, the
// newest version each writer of the object stored in the segments before
// seg, as (writer, version): of vs, the object's (segment, writer,
// newest version) in each segment of the window, those of the earlier
// segments sorted by writer and version, the last of each writer's. The
// sorted array is the one element of an array that a lambda reads, so that
// the SQL names it once (as versionRanks).
const newestBefore = `arrayMap(x -> arrayFilter((e, next) -> tupleElement(e, 1) != next, x, arrayResize(arrayPopFront(arrayMap(e -> tupleElement(e, 1), x)), length(x), '')),
			[arraySort(arrayMap(v -> (tupleElement(v, 2), tupleElement(v, 3)), arrayFilter((v, s) -> tupleElement(v, 1) < s, vs, replicate(seg, vs))))])[1]`

// panelConflictBlockers are the conflicts with their blockers as a panel
// reads them: its window is known only to ClickHouse, so both sources,
// the raw conflicts from the window's events whose hours are not clean.
var panelConflictBlockers = conflictBlockersFrom(true, true, `{raw_range}`, `{history_raw}`)
