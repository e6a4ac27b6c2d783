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
}

// Plan is where a window is read from: clean hours from the hour caches,
// each with its version, and the rest, as half-open ranges of Unix
// microseconds, from events.
type Plan struct {
	Clean []CleanHour
	Raw   [][2]int64
}

// CleanHour is a clean hour (its start) and the version of its caches.
type CleanHour struct {
	Hour    time.Time
	Version uint64
}

// PlanReport splits [since, until) into its whole hours that clean (as
// CleanHours reads them) lists, and the rest. Without clean hours all of
// the window is read from events.
func PlanReport(since, until time.Time, clean []CleanHour) Plan {
	var p Plan
	clean = slices.SortedFunc(slices.Values(clean), func(a, b CleanHour) int { return a.Hour.Compare(b.Hour) })
	at := since.UnixMicro()
	end := until.UnixMicro()
	for _, c := range clean {
		h := c.Hour.UnixMicro()
		if h < at || h+time.Hour.Microseconds() > end {
			continue // not a whole hour of the window, or out of order
		}
		if h > at {
			p.Raw = append(p.Raw, [2]int64{at, h})
		}
		p.Clean = append(p.Clean, c)
		at = h + time.Hour.Microseconds()
	}
	if at < end {
		p.Raw = append(p.Raw, [2]int64{at, end})
	}
	return p
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
	var ts []string
	for _, c := range p.Clean {
		ts = append(ts, "(toDateTime("+strconv.FormatInt(c.Hour.Unix(), 10)+"), toUInt64("+strconv.FormatUint(c.Version, 10)+"))")
	}
	if len(ts) == 1 { // ((a, b)) would be one tuple, not a set of one
		ts = append(ts, ts[0])
	}
	first, last := p.Clean[0].Hour.Unix(), p.Clean[len(p.Clean)-1].Hour.Unix()
	return "(event_date >= toDate(toDateTime(" + strconv.FormatInt(first, 10) + "), 'UTC') AND event_date <= toDate(toDateTime(" +
		strconv.FormatInt(last, 10) + "), 'UTC') AND (hour, version) IN (" + strings.Join(ts, ", ") + "))"
}

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

// reportFilters narrows by each filter parameter; empty means any. The
// report has no toggle: it hides nothing.
var reportFilters = func() string {
	var fs []string
	for _, f := range Filters {
		if f.Hides != "" {
			continue
		}
		fs = append(fs, "(@"+f.Name+" = '' OR "+f.Column+" = @"+f.Name+")")
	}
	return "(" + strings.Join(fs, " AND ") + ")"
}()

// Bind renders s for the report.
func (r Report) Bind(s Statement) string {
	return replace(s.SQL,
		"{loop_conflicts}", loopConflicts, "{loop_successes}", loopSuccesses,
		"{filters}", reportFilters, "{request_filters}", "1", // the report narrows by no verb or code
		"{raw_window}", r.Plan.rawWindow(), "{raw_range}", r.Plan.rawWindow(), "{rollup_window}", r.Plan.rollupWindow(), "{window}", reportWindow, "{events_window}", reportWindow,
		"{bucket}", "toDateTime(intDiv(toUInt32(event_time), @interval_s) * @interval_s)",
		"{end_us}", "@until_us",
		"{db}", r.Database)
}
