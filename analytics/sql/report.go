package sql

import (
	"slices"
	"strconv"
	"strings"
)

// Report renders statements for `auditsink report`: every parameter stays
// a bound @name parameter (client-side, quoted by the driver), and the
// window is [@since_us, @until_us) split into request_rollup's whole hours
// [@rollup_from_us, @rollup_to_us) and the raw edges around them
// ([@edge1_from_us, @edge1_last_us] and [@edge2_from_us, @edge2_last_us],
// closed). The caller computes the split and binds those parameters too.
type Report struct {
	// Database holds the tables.
	Database string
	// RawLoops derives the retry-loop rows from events instead of reading
	// the tables of migration 3 (for windows that begin before loop_epoch).
	RawLoops bool
	// NoDuplicates says that no event of the window is recorded as stored
	// more than once (duplicate_events), so the statements skip the
	// correction: the same answers, cheaper.
	NoDuplicates bool
	// KeyedByInstant says that no event shares its instant and fingerprint
	// with a recorded duplicate of another identity, so the correction may
	// match events to duplicates by those two numbers instead of the
	// identity: the same answers, cheaper. The caller checks it
	// (InstantKeyCollisions).
	KeyedByInstant bool
}

// The report's window parameters, bound by the caller beside the
// statements' own.
const (
	ReportSinceUs      = "since_us"
	ReportUntilUs      = "until_us"
	ReportRollupFromUs = "rollup_from_us"
	ReportRollupToUs   = "rollup_to_us"
	ReportEdge1FromUs  = "edge1_from_us"
	ReportEdge1LastUs  = "edge1_last_us"
	ReportEdge2FromUs  = "edge2_from_us"
	ReportEdge2LastUs  = "edge2_last_us"
	// ReportEdge1Sign and ReportEdge2Sign are +1 where an edge's events
	// add to request_rollup's hours, -1 where they are subtracted (the
	// edge is the part outside the window of an hour read whole).
	ReportEdge1Sign = "edge1_sign"
	ReportEdge2Sign = "edge2_sign"
)

// reportWindow is the report's half-open window [@since_us, @until_us) on
// the stage timestamp in microseconds, with the day partitions it spans so
// that ClickHouse reads only those.
const reportWindow = `event_date >= toDate(toDateTime(intDiv(@since_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@until_us, 1000000))) AND event_time_us >= @since_us AND event_time_us < @until_us`

// reportRawWindow is the window minus the rollup's whole hours: two edges,
// each a closed range with the day partitions it spans. An empty edge has
// from > last and spans no day, so ClickHouse reads nothing for it (a
// condition the partition pruning cannot see through, such as if(), would
// make it read the day).
const reportRawWindow = `(` + rawEdge1 + ` OR ` + rawEdge2 + `)`

const (
	rawEdge1 = `(event_date >= toDate(toDateTime(intDiv(@edge1_from_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@edge1_last_us, 1000000))) AND event_time_us >= @edge1_from_us AND event_time_us <= @edge1_last_us)`
	rawEdge2 = `(event_date >= toDate(toDateTime(intDiv(@edge2_from_us, 1000000))) AND event_date <= toDate(toDateTime(intDiv(@edge2_last_us, 1000000))) AND event_time_us >= @edge2_from_us AND event_time_us <= @edge2_last_us)`
)

// reportRawSign is the sign of a raw edge's event: the edges are in
// order, and an empty one lies before every event.
const reportRawSign = `if(event_time_us <= @edge1_last_us, @edge1_sign, @edge2_sign)`

// reportRollupWindow selects the rollup's whole hours [@rollup_from_us, @rollup_to_us).
const reportRollupWindow = `hour >= toDateTime(intDiv(@rollup_from_us, 1000000)) AND hour < toDateTime(intDiv(@rollup_to_us, 1000000))`

// reportFilters narrows by each filter parameter; empty means any.
var reportFilters = func() string {
	var fs []string
	for _, f := range Filters {
		fs = append(fs, "(@"+f.Name+" = '' OR "+f.Column+" = @"+f.Name+")")
	}
	return "(" + strings.Join(fs, " AND ") + ")"
}()

// Bind renders s for the report.
func (r Report) Bind(s Statement) string {
	return keyedReadRef.ReplaceAllString(r.bind(s), "")
}

// bind is Bind keeping the keyed reads' numbers (keyedReadRef).
func (r Report) bind(s Statement) string {
	lc, lcu, ls, dups, key := loopConflictsTable, loopConflictsPlain, loopSuccessesTable, corrected, identityKey
	if r.KeyedByInstant {
		key = instantKey
	}
	if r.NoDuplicates {
		lc, dups = loopConflictsPlain, noDuplicates
	}
	if r.RawLoops {
		lc, lcu, ls = loopConflictsRaw, loopConflictsRawUncorrected, loopSuccessesRaw
	}
	return correction(replace(s.SQL,
		"{loop_conflicts}", lc, "{loop_conflicts_uncorrected}", lcu, "{loop_successes}", ls,
		"{duplicates}", dups, "{duplicate_key}", key,
		"{filters}", reportFilters,
		"{raw_window}", reportRawWindow, "{raw_sign}", reportRawSign, "{rollup_window}", reportRollupWindow, "{window}", reportWindow, "{events_window}", reportWindow,
		"{bucket}", "toDateTime(intDiv(toUInt32(event_time), @interval_s) * @interval_s)",
		"{end_us}", "@until_us",
		"{db}", r.Database), !r.NoDuplicates)
}

// InstantKeyCollisions is a query that counts the events that the
// statements, bound by r, read by instant and fingerprint where a
// recorded duplicate has the same two but is not that event (another audit
// ID, stage or cluster). Where it counts none, r with KeyedByInstant
// answers as r matching by identity. It reads only where the statements'
// keyed raw reads do, with their parameters (the report's); "" when they
// make none.
func (r Report) InstantKeyCollisions(statements ...Statement) string {
	r.NoDuplicates, r.KeyedByInstant = false, false
	var reads, windows []string
	for _, s := range statements {
		for _, m := range keyedReadRef.FindAllStringSubmatch(r.bind(s), -1) {
			n, _ := strconv.Atoi(m[1])
			kr := keyedReads[n]
			reads = append(reads, r.Bind(Statement{SQL: "(" + kr.prewhere + " AND " + kr.window + ")"}))
			windows = append(windows, r.Bind(Statement{SQL: kr.window}))
		}
	}
	if len(reads) == 0 {
		return ""
	}
	// A read skips the events whose key a duplicate of its window holds,
	// whatever the duplicate's other columns: the duplicates come from the
	// reads' windows alone.
	either := func(conds []string) string {
		slices.Sort(conds)
		return "(" + strings.Join(slices.Compact(conds), " OR ") + ")"
	}
	dups := either(windows)
	return `SELECT count() FROM ` + r.Database + `.events
PREWHERE ` + either(reads) + ` AND (` + instantKey + `) IN (SELECT ` + instantKey + ` FROM ` + r.Database + `.duplicate_events WHERE ` + dups + `)
WHERE (` + identityKey + `) NOT IN (SELECT ` + identityKey + ` FROM ` + r.Database + `.duplicate_events WHERE ` + dups + `)`
}
