package sql

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Type is how a parameter is bound.
type Type string

// The parameter types.
const (
	TypeString Type = "String"
	TypeUInt64 Type = "UInt64"
	TypeInt    Type = "Int"
	TypeFloat  Type = "Float64"
)

// Param is one @name parameter of a statement.
type Param struct {
	// Name is the parameter as the SQL writes it, without the @.
	Name string
	Type Type
	// Meaning says what the parameter selects, for readers and the
	// generated dashboards.
	Meaning string
	// Column is the column (or expression) a filter narrows; empty for
	// other parameters. Filters are placed by {filters} or
	// {request_filters}, and empty means any value.
	Column string
	// Hides makes the parameter a toggle of {filters}: the value yes
	// hides the rows that match this condition, any other hides nothing.
	Hides string
}

// The parameters of the statements.
var (
	Cluster         = Param{Name: "cluster", Type: TypeString, Meaning: "the source cluster whose events are read"}
	Namespace       = Param{Name: "namespace", Type: TypeString, Meaning: "narrows to one namespace (empty: any)", Column: "namespace"}
	Resource        = Param{Name: "resource", Type: TypeString, Meaning: "narrows to one resource, such as configmaps (empty: any)", Column: "resource"}
	User            = Param{Name: "user", Type: TypeString, Meaning: "narrows to one writer: the impersonated user, else the user (empty: any)", Column: "writer"}
	Name            = Param{Name: "name", Type: TypeString, Meaning: "narrows to objects of one name (empty: any)", Column: "name"}
	Top             = Param{Name: "top", Type: TypeInt, Meaning: "bounds every list"}
	GapUs           = Param{Name: "gap_us", Type: TypeUInt64, Meaning: "the longest pause inside a retry loop, in microseconds"}
	Threshold       = Param{Name: "threshold", Type: TypeInt, Meaning: "the fewest version conflicts that make a retry loop"}
	MinHandoffs     = Param{Name: "min_handoffs", Type: TypeUInt64, Meaning: "the fewest handoffs (changes of a field by another writer than the one who set its value before) that make a field fight"}
	IntervalS       = Param{Name: "interval_s", Type: TypeUInt64, Meaning: "the width of a series' time bucket, in seconds"}
	MinWrites       = Param{Name: "min_writes", Type: TypeUInt64, Meaning: "the fewest write attempts for a conflict rate other than 0"}
	StaleUs         = Param{Name: "stale_us", Type: TypeUInt64, Meaning: "how long after its last conflict an unresolved retry loop counts as stale, in microseconds"}
	Verb            = Param{Name: "verb", Type: TypeString, Meaning: "narrows to requests of one verb, such as update (empty: any); events keep it, and of the hour caches only the version conflicts'", Column: "verb"}
	Code            = Param{Name: "code", Type: TypeString, Meaning: "narrows to requests answered with one HTTP status code, such as 409 (empty: any); events keep it, and the version conflicts' hour cache holds 409s alone", Column: "toString(code)"}
	HideSystem      = Param{Name: "hide_system", Type: TypeString, Meaning: "yes hides the writers of Kubernetes itself (SystemWriter); anything else hides nothing", Hides: SystemWriter}
	MinBucketWrites = Param{Name: "min_bucket_writes", Type: TypeUInt64, Meaning: "the fewest write attempts in a series' bucket for it to have a conflict rate"}
	StormS          = Param{Name: "storm_s", Type: TypeUInt64, Meaning: "the window of the conflict-storm rate, in seconds"}
	StormRate       = Param{Name: "storm_rate", Type: TypeFloat, Meaning: "the version-conflict rate above which a window is a storm"}
)

// Filters are the filter parameters, in the order {filters} writes them:
// on columns that events, the hour caches and the retry-loop rows all
// keep. The report has no toggle (HideSystem): it hides nothing.
var Filters = []Param{Namespace, Resource, User, Name, HideSystem}

// RequestFilters narrow requests by columns that only events keep, not
// the hour caches: {request_filters} writes them, and only statements that
// read events alone use it. The report narrows by neither.
var RequestFilters = []Param{Verb, Code}

// Source is where a part of the window is read from.
type Source string

// The sources.
const (
	// Raw is the events table, one row per identity.
	Raw Source = "raw"
	// Rollup is the hour caches (hour_requests, hour_loop_conflicts,
	// hour_loop_successes), one version per clean hour.
	Rollup Source = "rollup"
)

// Window is one way a statement places time: a placeholder in its SQL, the
// column the placeholder filters or buckets, and the source it reads.
type Window struct {
	Placeholder string
	Column      string
	Source      Source
	Meaning     string
}

// The windows.
var (
	// Whole is the whole window on event_time_us, on events or on the
	// retry-loop rows (each has event_date and event_time_us).
	Whole = Window{"{window}", "event_time_us", Raw, "the whole window"}
	// EventsWhole is the whole window on events' event_time, for
	// statements that read only events.
	EventsWhole = Window{"{events_window}", "event_time", Raw, "the whole window, on events"}
	// RawEdges is the part of the window that the hour caches do not
	// answer, on events: the parts of hours the window cuts, and the
	// whole hours that are not clean (open, or written since their last
	// compaction).
	RawEdges = Window{"{raw_window}", "event_time_us", Raw, "the window minus the clean whole hours"}
	// RawRange is a plain time range that holds RawEdges: what each event
	// table's PREWHERE reads (DistinctEvents), with no subquery in it.
	RawRange = Window{"{raw_range}", "event_time_us", Raw, "a time range holding the raw edges, without subqueries"}
	// HistoryRaw is the window minus its clean whole hours, on the field
	// history: what the field changes compute raw (the hours the window
	// cuts whole, unlike RawEdges).
	HistoryRaw = Window{"{history_raw}", "event_time_us", Raw, "the window minus the clean whole hours, on the field history"}
	// RollupHours is the clean whole hours inside the window, each with
	// the version of its caches to read.
	RollupHours = Window{"{rollup_window}", "hour", Rollup, "the clean whole hours, from the hour caches"}
	// MinuteSpans is the whole minutes of the clean hours the window cuts,
	// from the minute caches, each hour with its version.
	MinuteSpans = Window{"{minute_window}", "minute", Rollup, "the whole minutes of the clean hours the window cuts, from the minute caches"}
	// LoopRollupHours is the clean hours and MinuteSpans, from the
	// retry-loop caches (whose rows each hold their time).
	LoopRollupHours = Window{"{loop_rollup_window}", "hour", Rollup, "the clean hours and the whole minutes of the clean hours the window cuts, from the retry-loop caches"}
	// Bucket is the start of a series' time bucket, as a DateTime.
	Bucket = Window{"{bucket}", "event_time", Raw, "the time bucket of a series"}
	// Start is the window's start (inclusive) in microseconds; End its
	// end (exclusive).
	Start = Window{"{start_us}", "event_time_us", Raw, "the start of the window, inclusive, in microseconds"}
	End   = Window{"{end_us}", "event_time_us", Raw, "the end of the window, exclusive, in microseconds"}
)

// Windows lists every window a binder must place.
var Windows = []Window{Whole, EventsWhole, RawEdges, RawRange, HistoryRaw, RollupHours, MinuteSpans, LoopRollupHours, Bucket, Start, End}

// Shape is what a statement returns.
type Shape string

// The shapes.
const (
	// Rows is a table: the named columns, one row per finding.
	Rows Shape = "rows"
	// Series is a time series: the first column is the bucket's time.
	Series Shape = "series"
	// Number is one row of one number.
	Number Shape = "number"
)

// Statement is one analytics query in its typed form.
type Statement struct {
	// Name identifies the statement; Title says what it shows.
	Name, Title string
	Shape       Shape
	// Params are the @name parameters the SQL uses; a filter parameter
	// is used through {filters}, interval_s through {bucket}.
	Params []Param
	// Time is where the SQL places time.
	Time []Window
	// Columns are the result's column names, in order.
	Columns []string
	// SQL is the text with placeholders: {db}, {filters},
	// {request_filters}, the windows, {writer_counted} (the counter rows
	// by writer and resource, which place time as counted does),
	// and {loop_conflicts} and {loop_successes} (the retry-loop rows,
	// which place time with {loop_rollup_window}, {raw_window} and
	// {raw_range}).
	SQL string
}

var (
	paramRef       = regexp.MustCompile(`@([a-z_]+)`)
	placeholderRef = regexp.MustCompile(`\{[a-z_]+\}`)
)

// ReadsSegments says whether the statement reads the field history in
// segments stitched together: the field changes ({field_changes}), the
// no-op writes ({noop_writes}) or the conflicts' blockers
// ({conflict_blockers}): SQL that, with both sources as a panel binds
// it, is long for 18.16 to analyse (the field changes' took about 0.5 s
// before reading a row).
func (s Statement) ReadsSegments() bool {
	return strings.Contains(s.SQL, fieldChanges) || strings.Contains(s.SQL, noopWrites) || strings.Contains(s.SQL, conflictBlockers)
}

// Validate checks that the statement declares exactly the parameters and
// windows its SQL uses.
func (s Statement) Validate() error {
	// {writer_counted} uses what counted does; {field_changes},
	// {noop_writes} and {conflict_blockers} place time as their every
	// source does.
	sql := replace(s.SQL, writerCounted, counted, fieldChanges, fieldChangesFrom(rollupSegments, true, true), noopWrites, panelNoopWrites,
		conflictBlockers, panelConflictBlockers)
	var used []string
	for _, m := range paramRef.FindAllStringSubmatch(sql, -1) {
		used = append(used, m[1])
	}
	if strings.Contains(sql, "{filters}") {
		for _, f := range Filters {
			used = append(used, f.Name)
		}
	}
	for _, c := range cacheFilters {
		if strings.Contains(sql, c.filters) {
			for _, f := range Filters {
				if !slices.Contains(c.lacks, f) {
					used = append(used, f.Name)
				}
			}
		}
		if strings.Contains(sql, c.unfiltered) {
			for _, f := range c.lacks {
				used = append(used, f.Name)
			}
		}
	}
	if strings.Contains(sql, "{request_filters}") || strings.Contains(sql, unfilteredRequests) {
		for _, f := range RequestFilters {
			used = append(used, f.Name)
		}
	}
	if strings.Contains(sql, Bucket.Placeholder) {
		used = append(used, IntervalS.Name)
	}
	var declared []string
	for _, p := range s.Params {
		declared = append(declared, p.Name)
	}
	if a, b := set(used), set(declared); !slices.Equal(a, b) {
		return fmt.Errorf("statement %s: uses parameters %v, declares %v", s.Name, a, b)
	}
	var places, windows []string
	for _, p := range placeholderRef.FindAllString(sql, -1) {
		switch p {
		case "{db}", "{filters}", "{request_filters}", unfilteredRequests, rawHours, namelessFilters, unnamed, writerFilters, writerUnfiltered:
		case "{loop_conflicts}", "{loop_successes}":
			places = append(places, LoopRollupHours.Placeholder, RawEdges.Placeholder, RawRange.Placeholder)
		default:
			places = append(places, p)
		}
	}
	for _, w := range s.Time {
		windows = append(windows, w.Placeholder)
	}
	if a, b := set(places), set(windows); !slices.Equal(a, b) {
		return fmt.Errorf("statement %s: places time with %v, declares %v", s.Name, a, b)
	}
	if len(s.Columns) == 0 {
		return fmt.Errorf("statement %s: no columns", s.Name)
	}
	if s.Shape == Series && s.Columns[0] != "time" {
		return fmt.Errorf("statement %s: a series starts with the column time, not %s", s.Name, s.Columns[0])
	}
	return nil
}

func set(xs []string) []string {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return slices.Compact(xs)
}

// replace fills placeholders in order: a later pair may fill what an
// earlier one wrote.
func replace(sql string, pairs ...string) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		sql = strings.ReplaceAll(sql, pairs[i], pairs[i+1])
	}
	return sql
}
