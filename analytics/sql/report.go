package sql

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report renders statements for `auditsink report`: every parameter stays
// a bound @name parameter (client-side, quoted by the driver), and the
// window is [@since_us, @until_us). Its clean whole hours are read from
// the hour caches and the rest from events; the caller reads which hours
// are clean (CleanHours) and plans the split (PlanReport) before it binds.
type Report struct {
	// Database holds the tables.
	Database string
	// Plan splits the window between the caches and events.
	Plan Plan
	// Narrowed are the filters (of Filters, none a toggle) the report was
	// given a value for. The others are left out of the SQL: on 18.16 a
	// condition such as (@namespace = '' OR namespace = @namespace) is
	// evaluated on every row, and cost a fifth to a third of the CPU of
	// each query over the caches.
	Narrowed []Param
}

// Plan is where a window is read from: clean whole hours from the hour
// caches, each with its version; the whole minutes of clean hours the
// window cuts from the minute caches (and the loop caches); and the rest,
// as half-open ranges of Unix microseconds, from events.
type Plan struct {
	Clean   []CleanHour
	Partial []PartialHour
	Raw     [][2]int64
	// Interleaved are the objects (object_hash) whose clean hours
	// interleave, when the report read them once (InterleavedRead), which
	// it does for a plan of clean hours alone (CachesOnly); otherwise
	// each statement finds them itself.
	Interleaved     []uint64
	InterleavedRead bool
	// Blocks are the blocks of clean hours whose field bounds the field
	// changes read in place of their hours' (ChooseBlocks).
	Blocks []Block
}

// CachesOnly says the plan reads the field changes from the caches of
// its clean hours alone: it has clean hours, and no raw or cut ones.
func (p Plan) CachesOnly() bool {
	return len(p.Clean) > 0 && len(p.Raw)+len(p.Partial) == 0
}

// CleanHour is a clean hour (its start) and the version of its caches,
// every cache of this layout (CacheLayout).
type CleanHour struct {
	Hour    time.Time
	Version uint64
}

// PartialHour is a clean hour that the window cuts, and the whole minutes
// [From, Until) (Unix microseconds) of it that the window holds.
type PartialHour struct {
	CleanHour
	From, Until int64
}

// PlanReport splits [since, until) between the caches of the clean hours
// that clean lists (as CleanHours reads them), and events: a clean hour
// inside the window is read from its hour caches; of a clean hour the
// window cuts, the whole minutes in the window are read from its minute
// caches; everything else (dirty hours, the seconds before the first and
// after the last whole minute) from events.
// Without clean hours all of the window is read from events.
func PlanReport(since, until time.Time, clean []CleanHour) Plan {
	var p Plan
	byHour := make(map[int64]CleanHour, len(clean))
	for _, c := range clean {
		byHour[c.Hour.UnixMicro()] = c
	}
	raw := func(from, to int64) {
		switch {
		case from >= to:
		case len(p.Raw) > 0 && p.Raw[len(p.Raw)-1][1] == from:
			p.Raw[len(p.Raw)-1][1] = to
		default:
			p.Raw = append(p.Raw, [2]int64{from, to})
		}
	}
	const hourUs, minuteUs = int64(time.Hour / time.Microsecond), int64(time.Minute / time.Microsecond)
	at, end := since.UnixMicro(), until.UnixMicro()
	for at < end {
		h := floorTo(at, hourUs)
		to := min(end, h+hourUs)
		c, ok := byHour[h]
		switch {
		case !ok:
			raw(at, to)
		case at == h && to == h+hourUs:
			p.Clean = append(p.Clean, c)
		case ceilTo(at, minuteUs) < floorTo(to, minuteUs):
			from, until := ceilTo(at, minuteUs), floorTo(to, minuteUs)
			raw(at, from)
			p.Partial = append(p.Partial, PartialHour{CleanHour: c, From: from, Until: until})
			raw(until, to)
		default:
			raw(at, to)
		}
		at = to
	}
	return p
}

// floorTo and ceilTo round Unix microseconds down and up to a multiple of
// unit (times before 1970 included).
func floorTo(us, unit int64) int64 {
	f := us / unit * unit
	if f > us {
		f -= unit
	}
	return f
}

func ceilTo(us, unit int64) int64 {
	f := floorTo(us, unit)
	if f < us {
		f += unit
	}
	return f
}

// The report's window parameters, bound by the caller beside the
// statements' own.
const (
	ReportSinceUs = "since_us"
	ReportUntilUs = "until_us"
)

// reportWindow is the report's half-open window [@since_us, @until_us) on
// the stage timestamp in microseconds, with the (UTC) day partitions and
// hours it spans so that ClickHouse reads only those.
var reportWindow = TimeRange("@since_us", "@until_us")

// rollupWindow selects the plan's clean hours, each with its version, and
// their day partitions. The hours and versions are numbers the report
// read from ClickHouse, written as literals.
func (p Plan) rollupWindow() string {
	if len(p.Clean) == 0 {
		return "0"
	}
	return hourVersions(p.Clean)
}

// hourVersions selects the rows of the given hours, each with its version,
// and their day partitions, in a table with event_date, hour and version.
// The hours and versions are numbers read from ClickHouse, written as
// literals; hours is not empty.
func hourVersions(hours []CleanHour) string {
	var ts []string
	first, last := hours[0].Hour.Unix(), hours[0].Hour.Unix()
	for _, c := range hours {
		ts = append(ts, "(toDateTime("+strconv.FormatInt(c.Hour.Unix(), 10)+"), toUInt64("+strconv.FormatUint(c.Version, 10)+"))")
		first, last = min(first, c.Hour.Unix()), max(last, c.Hour.Unix())
	}
	return "(event_date >= toDate(toDateTime(" + strconv.FormatInt(first, 10) + "), 'UTC') AND event_date <= toDate(toDateTime(" +
		strconv.FormatInt(last, 10) + "), 'UTC') AND (hour, version) IN " + SetOf(ts) + ")"
}

// partialWindow selects the plan's partial hours, each with its version
// and its whole minutes, in a table with event_date, hour, version and the
// time column column; bound writes a bound (Unix microseconds) as that
// column's SQL value. "0" (nothing) without any.
func (p Plan) partialWindow(bound func(us int64) string, column string) string {
	if len(p.Partial) == 0 {
		return noRows
	}
	var ps []string
	for _, h := range p.Partial {
		ps = append(ps, "(event_date = toDate(toDateTime("+strconv.FormatInt(h.Hour.Unix(), 10)+"), 'UTC') AND hour = toDateTime("+
			strconv.FormatInt(h.Hour.Unix(), 10)+") AND version = toUInt64("+strconv.FormatUint(h.Version, 10)+") AND "+
			column+" >= "+bound(h.From)+" AND "+column+" < "+bound(h.Until)+")")
	}
	return "(" + strings.Join(ps, " OR ") + ")"
}

// minuteWindow selects the partial hours' whole minutes in the minute
// caches.
func (p Plan) minuteWindow() string {
	return p.partialWindow(func(us int64) string { return "toDateTime(" + strconv.FormatInt(us/1_000_000, 10) + ")" }, "minute")
}

// loopRollupWindow selects the loop caches' rows of the plan's clean
// hours and of its partial hours' whole minutes.
func (p Plan) loopRollupWindow() string {
	minutes := p.partialWindow(func(us int64) string { return strconv.FormatInt(us, 10) }, "event_time_us")
	switch {
	case len(p.Partial) == 0:
		return p.rollupWindow()
	case len(p.Clean) == 0:
		return minutes
	}
	return "(" + p.rollupWindow() + " OR " + minutes + ")"
}

// noRows selects nothing, by a day that holds no partition, so that 18.16
// reads no part of the table (a plain 0 still reads its columns).
const noRows = "(event_date = toDate('1970-01-01') AND 0)"

// rawWindow selects the plan's raw ranges of events, each with the day
// partitions it spans; "0" (nothing) without any.
func (p Plan) rawWindow() string {
	if len(p.Raw) == 0 {
		return "0"
	}
	var rs []string
	for _, r := range p.Raw {
		rs = append(rs, "("+TimeRange(strconv.FormatInt(r[0], 10), strconv.FormatInt(r[1], 10))+")")
	}
	return "(" + strings.Join(rs, " OR ") + ")"
}

// historySources says where the plan's field history comes from: the
// clean whole hours' caches (cached), the rows of the rest (raw), or
// both; without clean hours, the window is read raw as one segment.
func (p Plan) historySources() (cached, raw bool) {
	return len(p.Clean) > 0, len(p.Clean) == 0 || len(p.Raw)+len(p.Partial) > 0
}

// fieldChanges are the field changes from the sources the plan reads:
// its clean whole hours from their caches, the rest raw.
func (p Plan) fieldChanges() string {
	if p.InterleavedRead && p.CachesOnly() {
		return cachedFieldChanges(p.segments(), p.Interleaved)
	}
	cached, raw := p.historySources()
	return fieldChangesFrom(p.segments(), cached, raw)
}

// noopWrites are the no-op writes from the sources the plan reads, as
// fieldChanges: its clean whole hours from their records, the rest raw,
// and the objects whose segments interleave raw over the window.
func (p Plan) noopWrites() string {
	if p.InterleavedRead && p.CachesOnly() {
		return noopWritesFrom(true, false, hashSet(p.Interleaved))
	}
	cached, raw := p.historySources()
	segs := p.segments()
	return noopWritesFrom(cached, raw, segs.interleaved(windowOrder(segs, raw)))
}

// conflictBlockers are conflict_causes' conflicts with their blockers
// from the sources the plan reads (historySources): the raw ones from
// the events of the window minus its clean whole hours.
func (p Plan) conflictBlockers() string {
	cached, raw := p.historySources()
	return conflictBlockersFrom(cached, raw, "{history_raw}", "1")
}

// historyRawWindow is the window minus the plan's clean whole hours
// (HistoryRaw): the ranges of the window before, between and after them,
// each a TimeRange, so that a read of events_by_hour skips the clean
// hours' granules by its key (a NOT IN of hours would read every row's
// time first). A range that is empty (a window that starts or ends on a
// clean hour) selects nothing.
func (p Plan) historyRawWindow() string {
	if len(p.Clean) == 0 {
		return reportWindow
	}
	const hourUs = int64(time.Hour / time.Microsecond)
	us := func(v int64) string { return strconv.FormatInt(v, 10) }
	from := "@since_us"
	var rs []string
	for _, c := range p.Clean {
		start := c.Hour.UnixMicro()
		if from != us(start) {
			rs = append(rs, "("+TimeRange(from, us(start))+")")
		}
		from = us(start + hourUs)
	}
	rs = append(rs, "("+TimeRange(from, "@until_us")+")")
	return "(" + strings.Join(rs, " OR ") + ")"
}

// filters narrows by each filter the report was given but those named
// in except; "1" without any. The report has no toggle: it hides nothing.
func (r Report) filters(except ...Param) string {
	var fs []string
	for _, f := range r.Narrowed {
		if f.Column != "" && f.Hides == "" && !slices.Contains(except, f) {
			fs = append(fs, "("+f.Column+" = @"+f.Name+")")
		}
	}
	if len(fs) == 0 {
		return "1"
	}
	return "(" + strings.Join(fs, " AND ") + ")"
}

// WriterCaches says whether the report's counter rows by writer come from
// the writer caches: the plan reads cached hours, and no filter names a
// column they lack (namespace, name). A window read from events alone
// keeps the object rows' path.
func (r Report) WriterCaches() bool {
	if len(r.Plan.Clean)+len(r.Plan.Partial) == 0 {
		return false
	}
	for _, f := range r.Narrowed {
		if slices.Contains(writerLacks, f) {
			return false
		}
	}
	return true
}

// cacheFilters fills each cache's filters (cacheFilters): those the
// report was given on columns the cache keeps, and whether it was given
// none of those it lacks.
func (r Report) cacheFilters() []string {
	var pairs []string
	for _, c := range cacheFilters {
		unfiltered := "1"
		for _, f := range c.lacks {
			if slices.Contains(r.Narrowed, f) {
				unfiltered = "0"
			}
		}
		pairs = append(pairs, c.filters, r.filters(c.lacks...), c.unfiltered, unfiltered)
	}
	return pairs
}

// Bind renders s for the report.
func (r Report) Bind(s Statement) string {
	byWriter := counted
	if r.WriterCaches() {
		byWriter = countedByWriter
	}
	sql := replace(s.SQL,
		fieldChanges, r.Plan.fieldChanges(),
		noopWrites, r.Plan.noopWrites(),
		conflictBlockers, r.Plan.conflictBlockers(),
		writerCounted, byWriter,
		"{loop_conflicts}", loopConflicts, "{loop_successes}", loopSuccesses)
	sql = replace(sql, r.cacheFilters()...)
	return replace(sql,
		"{filters}", r.filters(),
		"{request_filters}", "1", unfilteredRequests, "1", // the report narrows by no verb or code
		"{raw_window}", r.Plan.rawWindow(), "{raw_range}", r.Plan.rawWindow(), rawHours, "1", "{rollup_window}", r.Plan.rollupWindow(), "{minute_window}", r.Plan.minuteWindow(), "{loop_rollup_window}", r.Plan.loopRollupWindow(), "{history_raw}", r.Plan.historyRawWindow(), "{window}", reportWindow, "{events_window}", reportWindow,
		"{bucket}", "toDateTime(intDiv(toUInt32(event_time), @interval_s) * @interval_s)",
		"{start_us}", "@since_us", "{end_us}", "@until_us",
		"{db}", r.Database)
}
