package sql

import "time"

// Blocks of hours (docs/auditsink.md, "Schema", migration 13). A block is
// a run of BlockSizes hours, aligned (it starts at a multiple of its
// length since the epoch), whose hours are all clean: its segment is the
// stitch of its hours' segments, stored as an hour's is (the changes that
// come out as from the whole history, the bounds of each field and of
// each object), under a version of its own, with a record that names the
// version of each of its hours it was built from. A reader takes a block
// in place of its hours' bounds only when those versions are the ones it
// pinned for the hours: a block is a pure function of the hour versions
// its record names, so a recompacted hour leaves its old blocks unread,
// and no block is ever stale for a reader that takes it. Stitching a day
// of hour segments reads each field's record of each hour (584,000 at
// 10M events); a few blocks read one record per field and block.
//
// A block's changes are those of the stitch of its hours that depend on
// no segment before it: every change but its first set after its first
// entry, and but the hours' own cached changes (which a reader takes from
// hour_field_changes, for every clean hour). Its bounds are the same as a
// raw segment of the same versions would give: the first entry of its
// first hour, the first and the last set after it, and the last value of
// its last hour. Its objects' bounds are those of its hours merged; an
// object whose hours interleave within the block has no records in it
// and is marked (interleaved), and a reader reads it raw over its whole
// window, as it does an object whose segments interleave.

// BlockSizes are the lengths of the blocks in hours, the longest first.
var BlockSizes = []int{8, 4, 2}

// BlockTables are the tables a block's build fills, each keyed by the
// block's first hour and its version; its record goes to block_caches.
var BlockTables = []string{"block_field_changes", "block_field_bounds", "block_object_bounds"}

// segmentSources are where the stitch reads its cached segments: the
// bounds of the clean hours that hours selects (an SQL condition on
// event_date, hour and version) and the blocks' of those blocks selects
// (none when empty).
type segmentSources struct{ hours, blocks string }

// rollupSegments are the clean hours' bounds alone, as a panel reads them.
var rollupSegments = segmentSources{hours: "{rollup_window}"}

// hourSeg is the segment of a cache row: its hour, or its block's first.
const hourSeg = `toUInt64(intDiv(toUInt32(hour), 3600))`

// objects are the bounds of each object in each cached segment.
func (s segmentSources) objects() string {
	sel := func(table, where string) string {
		return `SELECT ` + historyKey + `, object_hash, ` + hourSeg + ` AS seg, ` + read(objectColumns) + `
		FROM {db}.` + table + ` WHERE cluster = @cluster AND ` + where
	}
	return s.union(sel("hour_object_bounds", s.hours), sel("block_object_bounds", s.blocks+` AND interleaved = 0`))
}

// order is what interleavedHashes reads of the cached segments.
func (s segmentSources) order() string {
	sel := func(table, where string) string {
		return `SELECT object_hash, ` + hourSeg + ` AS seg, min_version, max_version, min_full, max_full, min_created
		FROM {db}.` + table + ` WHERE cluster = @cluster AND ` + where
	}
	return s.union(sel("hour_object_bounds", s.hours), sel("block_object_bounds", s.blocks))
}

// records are the records of the cached segments' field bounds.
func (s segmentSources) records() string {
	sel := func(table, where string) string {
		return `
	SELECT ` + historyKey + `, field, object_hash, first_version, ` + hourSeg + ` AS seg, first_vals, CAST(first_writer AS String) AS first_writer,
		first_time_us, first_audit_id, CAST(first_basis AS String) AS first_basis,
		arrayFilter(x -> tupleElement(x, 8) = 1, [
			(next_vals, next_before, CAST(next_writer AS String), next_time_us, next_audit_id, CAST(next_basis AS String), toUInt8(next_basis != 'create'), has_next),
			(last_set_vals, last_set_before, CAST(last_set_writer AS String), last_set_time_us, last_set_audit_id, '', toUInt8(0), has_last)]) AS later,
		end_vals
	FROM {db}.` + table + `
	WHERE cluster = @cluster AND ` + where
	}
	return s.union(sel("hour_field_bounds", s.hours), sel("block_field_bounds", s.blocks))
}

// interleaved are the objects whose segments of order interleave
// (interleavedHashes), and those the blocks mark.
func (s segmentSources) interleaved(order string) string {
	if s.blocks == "" {
		return interleavedHashes(order)
	}
	return `(
	SELECT object_hash FROM ` + interleavedHashes(order) + `
	UNION ALL SELECT object_hash FROM {db}.block_object_bounds WHERE cluster = @cluster AND ` + s.blocks + ` AND interleaved = 1)`
}

// union is the rows of hours, and of blocks when s has blocks.
func (s segmentSources) union(hours, blocks string) string {
	if s.blocks == "" {
		return `(` + hours + `)`
	}
	return `(` + hours + `
		UNION ALL ` + blocks + `)`
}

// Block is a block a report reads in place of its hours: its first hour,
// its length in hours and its version.
type Block struct {
	Start   time.Time
	Hours   int
	Version uint64
}

// BlockRecord is a block's record: its first hour, length and version,
// and the versions of its hours it was built from, in order.
type BlockRecord struct {
	Block
	HourVersions []uint64
}

// Blocks are the block records of [@from_s, @to_s) (Unix seconds),
// as (first hour in Unix seconds, hours, version, versions of its hours),
// the newest record first where two name the same hour versions.
const Blocks = `SELECT toUInt32(hour), hours, version, versions FROM {db}.block_caches
	WHERE event_date >= toDate(toDateTime(@from_s), 'UTC') AND event_date <= toDate(toDateTime(@to_s), 'UTC')
		AND hour >= toDateTime(@from_s) AND hour < toDateTime(@to_s)
	ORDER BY hour, hours, compacted_at DESC, version DESC`

// ScanBlockRecord reads a row of Blocks into r with scan (a driver's
// Rows.Scan).
func ScanBlockRecord(scan func(dest ...any) error, r *BlockRecord) error {
	var (
		h uint32
		n uint8
	)
	if err := scan(&h, &n, &r.Version, &r.HourVersions); err != nil {
		return err
	}
	r.Start, r.Hours = time.Unix(int64(h), 0).UTC(), int(n)
	return nil
}

// ChooseBlocks puts blocks of records in the plan in place of their
// hours: going through its clean hours in order, at each the longest
// block that starts there whose hours are all clean in the plan, with the
// versions its record names. The clean hours stay in the plan (every
// other cache of theirs is read as before); only their field bounds are
// read from the blocks.
func (p *Plan) ChooseBlocks(records []BlockRecord) {
	p.Blocks = nil
	clean := make(map[int64]uint64, len(p.Clean))
	for _, c := range p.Clean {
		clean[c.Hour.Unix()] = c.Version
	}
	matches := func(r BlockRecord) bool {
		if len(r.HourVersions) != r.Hours {
			return false
		}
		for i, v := range r.HourVersions {
			if cv, ok := clean[r.Start.Unix()+int64(i)*3600]; !ok || cv != v {
				return false
			}
		}
		return true
	}
	best := map[[2]int64]Block{}
	for _, r := range records {
		key := [2]int64{r.Start.Unix(), int64(r.Hours)}
		if _, ok := best[key]; !ok && matches(r) {
			best[key] = r.Block
		}
	}
	for i := 0; i < len(p.Clean); {
		h := p.Clean[i].Hour.Unix()
		took := 1
		for _, n := range BlockSizes {
			if b, ok := best[[2]int64{h, int64(n)}]; ok {
				p.Blocks = append(p.Blocks, b)
				took = n
				break
			}
		}
		// The plan's clean hours are in order and distinct, and a
		// matching block's hours are all among them.
		for end := h + int64(took)*3600; i < len(p.Clean) && p.Clean[i].Hour.Unix() < end; i++ {
		}
	}
}

// inBlock says whether the plan reads the hour h from a block.
func (p Plan) inBlock(h time.Time) bool {
	for _, b := range p.Blocks {
		if !h.Before(b.Start) && h.Before(b.Start.Add(time.Duration(b.Hours)*time.Hour)) {
			return true
		}
	}
	return false
}

// segments are where the plan's field changes read their cached
// segments: the blocks it chose, and the clean hours outside them.
func (p Plan) segments() segmentSources {
	if len(p.Blocks) == 0 {
		return segmentSources{hours: p.rollupWindow()}
	}
	var hours []CleanHour
	for _, c := range p.Clean {
		if !p.inBlock(c.Hour) {
			hours = append(hours, c)
		}
	}
	s := segmentSources{hours: noRows}
	if len(hours) > 0 {
		s.hours = hourVersions(hours)
	}
	var bs []CleanHour
	for _, b := range p.Blocks {
		bs = append(bs, CleanHour{Hour: b.Start, Version: b.Version})
	}
	s.blocks = hourVersions(bs)
	return s
}

// BlockBuild is the SQL of building one block, each statement with {db}
// to fill and the parameters @cluster (a build runs once for each cluster
// its hours hold), @hour_s (its first hour), @version (its own), and in
// the record also @hours and @versions.
type BlockBuild struct {
	// Clusters lists the clusters of the block's hours, one per row.
	Clusters string
	// Inserts write the block's changes, field bounds and object bounds.
	Inserts []string
	// Record makes the block readable (the last statement).
	Record string
}

// BuildBlock is the SQL that builds the block of hours (their starts in
// order, each with the version of its caches the block is built from).
func BuildBlock(hours []CleanHour) BlockBuild {
	segs := segmentSources{hours: hourVersions(hours)}
	records, _ := stitchRecords(segs, false)
	interleaved := segs.interleaved(segs.order())
	records = `(SELECT * FROM ` + records + ` WHERE object_hash NOT IN ` + interleaved + `)`
	sets := blockSets(records)
	at := `toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt64(@version)`
	return BlockBuild{
		Clusters: `SELECT DISTINCT CAST(cluster AS String) FROM {db}.hour_object_bounds WHERE ` + segs.hours + ` ORDER BY 1`,
		Inserts: []string{
			`INSERT INTO {db}.block_field_changes (event_date, hour, version, object_hash, ` + changeColumns + `)
	SELECT ` + at + `, object_hash, ` + changeColumns + ` FROM ` + blockChanges(sets),
			`INSERT INTO {db}.block_field_bounds (event_date, hour, version, object_hash, ` + historyKey + `, field, ` + names(boundColumns) + `)
	SELECT ` + at + `, object_hash, ` + historyKey + `, field, ` + names(boundColumns) + ` FROM ` + blockBounds(sets),
			`INSERT INTO {db}.block_object_bounds (event_date, hour, version, object_hash, ` + historyKey + `, ` + names(objectColumns) + `, interleaved)
	SELECT ` + at + `, object_hash, ` + historyKey + `, ` + names(objectColumns) + `, toUInt8(object_hash IN ` + interleaved + `) FROM ` + blockObjects(segs.hours),
		},
		Record: `INSERT INTO {db}.block_caches (event_date, hour, hours, version, versions, compacted_at)
	SELECT toDate(toDateTime(@hour_s), 'UTC'), toDateTime(@hour_s), toUInt8(@hours), toUInt64(@version), @versions, now()`,
	}
}

// blockSets are, per object field of the block, its records in version
// order (recs) and the sets after its first entry (later), each an
// element as stitchedChanges lists them.
func blockSets(records string) string {
	return `(
	SELECT ` + historyKey + `, field, object_hash, recs,
		if(tupleElement(recs[1], 7) = 'create', arrayPopFront(sets), sets) AS later
	FROM (
		SELECT ` + historyKey + `, field,` + stitchSets + `
		FROM ` + records + `
		GROUP BY ` + historyKey + `, field))`
}

// blockChanges are the changes of the block's sets that depend on no
// segment before it: each set after the first that its stitch emits,
// with the set before it.
func blockChanges(sets string) string {
	return `(
	SELECT ` + historyKey + `, object_hash, field, tupleElement(cur, 1) AS vals, tupleElement(cur, 3) AS writer, tupleElement(cur, 4) AS time_us,
		tupleElement(cur, 5) AS audit_id, tupleElement(cur, 6) AS basis, tupleElement(prev, 1) AS prev_vals, tupleElement(prev, 2) AS prev_before,
		tupleElement(prev, 3) AS prev_writer, tupleElement(prev, 4) AS prev_time_us, tupleElement(prev, 5) AS prev_audit_id, ` + changeFlags + `
	FROM ` + sets + `
	ARRAY JOIN arrayPopFront(later) AS cur, arrayPopBack(later) AS prev
	WHERE tupleElement(cur, 7) = 1)`
}

// blockBounds are the bounds of each field of the block (boundColumns):
// the first entry of its first record, the first and the last set after
// it, and the last value of its last record.
func blockBounds(sets string) string {
	return `(
	SELECT ` + historyKey + `, field, object_hash,
		tupleElement(recs[1], 1) AS first_version, tupleElement(recs[1], 3) AS first_vals, tupleElement(recs[1], 4) AS first_writer,
		tupleElement(recs[1], 5) AS first_time_us, tupleElement(recs[1], 6) AS first_audit_id, tupleElement(recs[1], 7) AS first_basis,
		toUInt8(length(later) >= 1) AS has_next, tupleElement(later[1], 1) AS next_vals, tupleElement(later[1], 2) AS next_before,
		tupleElement(later[1], 3) AS next_writer, tupleElement(later[1], 4) AS next_time_us, tupleElement(later[1], 5) AS next_audit_id,
		tupleElement(later[1], 6) AS next_basis,
		toUInt8(length(later) >= 2) AS has_last, tupleElement(later[-1], 1) AS last_set_vals, tupleElement(later[-1], 2) AS last_set_before,
		tupleElement(later[-1], 3) AS last_set_writer, tupleElement(later[-1], 4) AS last_set_time_us, tupleElement(later[-1], 5) AS last_set_audit_id,
		tupleElement(recs[-1], 9) AS end_vals
	FROM ` + sets + `)`
}

// blockObjects are the bounds of each object of the block's hours (those
// hours selects in hour_object_bounds) merged: its first version from its
// first hour, its last from its last, its first whole view, the first
// and the last create after it, and every field.
func blockObjects(hours string) string {
	w := func(i string) string { return "tupleElement(w, " + i + ")" }
	return `(
	SELECT ` + historyKey + `, object_hash, block_min AS min_version, block_max AS max_version, block_min_full AS min_full,
		block_max_full AS max_full, block_min_created AS min_created,
		toUInt8(notEmpty(ws)) AS has_whole, tupleElement(ws[1], 2) AS whole_version, tupleElement(ws[1], 3) AS whole_writer,
		tupleElement(ws[1], 4) AS whole_time_us, tupleElement(ws[1], 5) AS whole_audit_id, tupleElement(ws[1], 6) AS whole_basis,
		toUInt8(notEmpty(creates)) AS has_create, tupleElement(creates[1], 1) AS next_create_writer,
		tupleElement(creates[1], 2) AS next_create_time_us, tupleElement(creates[1], 3) AS next_create_audit_id,
		toUInt8(length(creates) > 1) AS has_last_create, tupleElement(creates[-1], 1) AS last_create_writer,
		tupleElement(creates[-1], 2) AS last_create_time_us, tupleElement(creates[-1], 3) AS last_create_audit_id,
		fields
	FROM (
		SELECT ` + historyKey + `, any(object_hash) AS object_hash, min(min_version) AS block_min, max(max_version) AS block_max,
			argMin(min_full, (min_version, hour)) AS block_min_full, argMax(max_full, (max_version, hour)) AS block_max_full,
			argMin(min_created, (min_version, hour)) AS block_min_created,
			arraySort(groupArrayIf((hour, whole_version, CAST(whole_writer AS String), whole_time_us, whole_audit_id, CAST(whole_basis AS String),
				has_create, CAST(next_create_writer AS String), next_create_time_us, next_create_audit_id,
				has_last_create, CAST(last_create_writer AS String), last_create_time_us, last_create_audit_id), has_whole = 1)) AS ws,
			arrayReduce('groupArrayArray', arrayMap((w, i) -> arrayMap(c -> (tupleElement(c, 1), tupleElement(c, 2), tupleElement(c, 3)),
				arrayFilter(c -> tupleElement(c, 4) = 1, [
					(` + w("3") + `, ` + w("4") + `, ` + w("5") + `, toUInt8(i > 1 AND ` + w("6") + ` = 'create')),
					(` + w("8") + `, ` + w("9") + `, ` + w("10") + `, ` + w("7") + `),
					(` + w("12") + `, ` + w("13") + `, ` + w("14") + `, ` + w("11") + `)])), ws, arrayEnumerate(ws))) AS creates,
			groupUniqArrayArray(fields) AS fields
		FROM {db}.hour_object_bounds
		WHERE cluster = @cluster AND ` + hours + `
		GROUP BY ` + historyKey + `))`
}

// SupersededBlocks lists the blocks that no reader can take any more, as
// (first hour in Unix seconds, version), so that their rows can be
// deleted (Store.Prune), with the hour versions SupersededVersions lists
// (of the same @grace_s). A block is read only while every hour version
// its record names is the one a reader pinned for its hour, and then
// only its newest record of those versions (Blocks, ChooseBlocks). A
// block is superseded when:
//   - an hour version its record names is superseded (SupersededVersions)
//     or has no record any more (pruned before): no reader pins it; or
//   - another record of the same hours and versions is the newest,
//     recorded @grace_s seconds ago or longer (builders that raced).
var SupersededBlocks = `SELECT DISTINCT toUInt32(hour) AS h, version FROM (
	SELECT hour, version FROM {db}.block_caches
	ARRAY JOIN versions AS v, arrayEnumerate(versions) AS i
	WHERE (toUInt32(toUInt32(hour) + (i - 1) * 3600), v) IN (SELECT h, version FROM (` + SupersededVersions + `))
		OR (toDateTime(toUInt32(hour) + (i - 1) * 3600), v) NOT IN (SELECT hour, version FROM {db}.hour_caches)
	UNION ALL
	SELECT hour, version FROM (
		SELECT hour, groupArray(version) AS all_versions, argMax(version, (compacted_at, version)) AS newest, max(compacted_at) AS newest_at
		FROM {db}.block_caches
		GROUP BY hour, hours, versions)
	ARRAY JOIN all_versions AS version
	WHERE version != newest AND newest_at < now() - @grace_s)
ORDER BY h, version`
