package sql

import (
	"fmt"
	"slices"
	"strings"
)

// Grafana renders statements for the Grafana ClickHouse data source
// (grafana-clickhouse-datasource): time becomes the plugin's macros, which
// its backend expands before the SQL reaches ClickHouse ($__fromTime and
// $__toTime are whole seconds and $__timeFilter includes both ends, so the
// window is [from, to + 1s) in microseconds), and parameters become
// Grafana template variables or literal values.
//
// Counting statements and the retry-loop rows read the window's clean
// whole hours from the hour caches, the whole minutes of the clean hours
// it cuts from the minute caches, and the rest from events, one row per
// identity, as the report does; a panel finds the clean hours in the same
// query (CleanHours).
type Grafana struct {
	// Database holds the tables.
	Database string
	// Variables are the template variables that stand for parameters, by
	// parameter name.
	Variables map[string]Variable
	// Values are literal SQL for the parameters without a variable (a
	// number, or a quoted string; a filter's '' means any, a toggle's
	// 'yes' hides and any other value does not). interval_s needs
	// neither: it is always $__interval_s.
	Values map[string]string
}

// Variable is a Grafana template variable standing for a parameter.
type Variable struct {
	// Name is the variable's name: the SQL refers to it as ${name}.
	Name string
	// Multi says the variable may select several values and "All" (whose
	// custom all value must be AllValue); else it holds one value, and for
	// a filter the empty value means any.
	Multi bool
}

// AllValue is the custom "All" value of the filter variables, and the
// filters read it as "any". Grafana puts it into the SQL as it is (before
// Grafana 10) or percent-encoded (since), which leaves it unchanged.
const AllValue = `__all__`

// Every variable reaches the SQL percent-encoded (${name:percentencode},
// JavaScript's encodeURIComponent that also encodes !'()*), inside single
// quotes, and decoded there: an encoded value has only letters, digits,
// -_.~ and %, so no value can end the string literal. Grafana's
// singlequote format escapes ' but not \, which ClickHouse honours: a
// value ending in \ would escape the closing quote. A multi-value
// variable encodes {a,b}; its values are split at the commas, so a value
// that holds a comma selects its parts.

// VariableText is the SQL string of variable name's value.
func VariableText(name string) string {
	return "decodeURLComponent('${" + name + ":percentencode}')"
}

// variableValues is the SQL array of a multi-value variable's values.
func variableValues(name string) string {
	return "splitByChar(',', replaceRegexpOne(" + VariableText(name) + `, '^[{](.*)[}]$', '\\1'))`
}

// The window and its whole hours, from the plugin's macros. $__toTime
// is inclusive, so the window ends a second after it.
const (
	fromUs = `toUInt64(toUInt32($__fromTime)) * 1000000`
	endUs  = `(toUInt64(toUInt32($__toTime)) + 1) * 1000000`
	// days prunes day partitions: event_date is the UTC day, whatever
	// the server's time zone.
	days = `event_date >= toDate($__fromTime, 'UTC') AND event_date <= toDate($__toTime, 'UTC')`
	// grafanaWindow is the window on event_time_us (events and the
	// retry-loop rows); grafanaEventsWindow on events' event_time.
	grafanaWindow       = days + ` AND ` + hours + ` AND event_time_us >= ` + fromUs + ` AND event_time_us < ` + endUs
	grafanaEventsWindow = days + ` AND ` + hours + ` AND $__timeFilter(event_time)`
	// hours prunes events_by_hour's key to the window's hours (TimeRange).
	hours = HourKey + ` >= intDiv(` + fromUs + `, 3600000000) AND ` + HourKey + ` <= intDiv(` + endUs + ` - 1, 3600000000)`
	// hoursFrom and hoursTo bound the window's whole hours, in seconds.
	hoursFrom = `(intDiv(toUInt32($__fromTime) + 3599, 3600) * 3600)`
	hoursTo   = `(intDiv(toUInt32($__toTime) + 1, 3600) * 3600)`
)

// The window's whole minutes, and the hours it touches (the whole ones
// and the ones it cuts), in seconds.
const (
	minutesFrom = `(intDiv(toUInt32($__fromTime) + 59, 60) * 60)`
	minutesTo   = `(intDiv(toUInt32($__toTime) + 1, 60) * 60)`
	touchedFrom = `(intDiv(toUInt32($__fromTime), 3600) * 3600)`
	touchedTo   = `(intDiv(toUInt32($__toTime) + 3600, 3600) * 3600)`
)

// grafanaClean is the window's clean whole hours, with their versions;
// grafanaTouched the clean hours it touches, the cut ones too.
var (
	grafanaClean   = CleanHours(hoursFrom, hoursTo)
	grafanaTouched = CleanHours(touchedFrom, touchedTo)
)

// The parts of the window, as the report's plan splits it (PlanReport):
// grafanaRollup is the clean whole hours in the hour caches;
// grafanaMinutes the whole minutes of the clean hours the window cuts, in
// the minute caches (a set of those hours, which the caches' key prunes
// by: an OR beside it would read every row's key); grafanaLoopRollup both in the retry-loop caches
// (whose rows carry their time); grafanaRaw the rest of the window in
// events.
var (
	grafanaRollup  = days + ` AND hour >= toDateTime(` + hoursFrom + `) AND hour < toDateTime(` + hoursTo + `) AND (hour, version) IN ` + grafanaClean
	grafanaMinutes = days + ` AND (hour, version) IN (SELECT hour, version FROM ` + grafanaTouched + `
		WHERE hour < toDateTime(` + hoursFrom + `) OR hour >= toDateTime(` + hoursTo + `))
		AND minute >= toDateTime(` + minutesFrom + `) AND minute < toDateTime(` + minutesTo + `)`
	grafanaLoopRollup = days + ` AND (hour, version) IN ` + grafanaTouched + `
		AND event_time_us >= ` + minutesFrom + ` * 1000000 AND event_time_us < ` + minutesTo + ` * 1000000`
	grafanaRaw = grafanaWindow + ` AND NOT (event_time_us >= ` + minutesFrom + ` * 1000000 AND event_time_us < ` + minutesTo + ` * 1000000
		AND toDateTime(intDiv(event_time_us, 3600000000) * 3600) IN (SELECT hour FROM ` + grafanaTouched + `))`
)

// grafanaHistoryRaw is the window minus its clean whole hours
// (HistoryRaw).
var grafanaHistoryRaw = grafanaWindow + ` AND toDateTime(intDiv(event_time_us, 3600000000) * 3600) NOT IN (SELECT hour FROM ` + grafanaClean + `)`

// grafanaRawHours are the window's hours that are not clean, on
// events_by_hour's key: its raw edges' hours (AllEvents). range() takes
// one argument on 18.16.
var grafanaRawHours = HourKey + ` IN (
	SELECT h FROM (SELECT intDiv(` + fromUs + `, 3600000000) + arrayJoin(range(toUInt64(intDiv(` + endUs + ` - 1, 3600000000) - intDiv(` + fromUs + `, 3600000000) + 1))) AS h)
	WHERE h NOT IN (SELECT toUInt64(intDiv(toUInt32(hour), 3600)) FROM ` + grafanaClean + `))`

// Bind renders s for a Grafana panel or alert query. It fails when a
// parameter has neither a variable nor a value.
func (g Grafana) Bind(s Statement) (string, error) {
	var filters, requestFilters []string
	// unfiltered are the conditions that each request filter selects any
	// request (unfilteredRequests).
	unfiltered := []string{"1"}
	// byFilter and anyOf are each filter's condition, and the condition
	// that it selects any row, for the caches' filters (cacheFilters).
	byFilter, anyOf := map[Param]string{}, map[Param]string{}
	params := []string{}
	for _, p := range s.Params {
		if p == IntervalS {
			params = append(params, "@"+p.Name, "$__interval_s")
			continue
		}
		v, isVar := g.Variables[p.Name]
		lit, isLit := g.Values[p.Name]
		if !isVar && !isLit {
			return "", fmt.Errorf("statement %s: parameter %s has neither a variable nor a value", s.Name, p.Name)
		}
		into := &filters
		isRequest := slices.Contains(RequestFilters, p)
		if isRequest {
			into = &requestFilters
		}
		if isRequest {
			unfiltered = append(unfiltered, anyValue(p, v, isVar, lit))
		}
		before := len(*into)
		switch {
		case p.Hides != "" && isVar && v.Multi:
			return "", fmt.Errorf("statement %s: toggle %s has the multi-value variable %s", s.Name, p.Name, v.Name)
		case p.Hides != "":
			ref := lit
			if isVar {
				ref = VariableText(v.Name)
			}
			*into = append(*into, "("+ref+" != 'yes' OR NOT ("+p.Hides+"))")
		case p.Column != "" && isVar && v.Multi:
			ref := variableValues(v.Name)
			*into = append(*into, "(has("+ref+", '"+AllValue+"') OR has("+ref+", "+p.Column+"))")
		case p.Column != "" && isVar:
			ref := VariableText(v.Name)
			*into = append(*into, "("+ref+" = '' OR "+p.Column+" = "+ref+")")
		case p.Column != "":
			*into = append(*into, "("+lit+" = '' OR "+p.Column+" = "+lit+")")
		case isVar && p.Type == TypeString:
			params = append(params, "@"+p.Name, VariableText(v.Name))
		case isVar:
			params = append(params, "@"+p.Name, "${"+v.Name+"}")
		default:
			params = append(params, "@"+p.Name, lit)
		}
		if !isRequest && len(*into) > before {
			byFilter[p], anyOf[p] = (*into)[before], anyValue(p, v, isVar, lit)
		}
	}
	// Each cache's filters, and the condition that those it lacks select
	// any row.
	var cached []string
	for _, c := range cacheFilters {
		var fs, lacking []string
		for _, p := range s.Params {
			switch cond, ok := byFilter[p]; {
			case !ok:
			case slices.Contains(c.lacks, p):
				lacking = append(lacking, anyOf[p])
			default:
				fs = append(fs, cond)
			}
		}
		cached = append(cached, c.filters, allOf(fs), c.unfiltered, allOf(lacking))
	}
	sql := replace(s.SQL,
		// Panels keep the object caches: their filters are variables,
		// known only when the query runs.
		writerCounted, counted,
		// A panel's window is known only as the query runs.
		fieldChanges, fieldChangesFrom(rollupSegments, true, true),
		noopWrites, panelNoopWrites,
		conflictBlockers, panelConflictBlockers,
		"{loop_conflicts}", loopConflicts, "{loop_successes}", loopSuccesses,
		"{filters}", allOf(filters), "{request_filters}", allOf(requestFilters), unfilteredRequests, allOf(unfiltered))
	sql = replace(sql, cached...)
	sql = replace(sql,
		"{raw_window}", grafanaRaw, "{raw_range}", grafanaWindow, rawHours, grafanaRawHours, "{rollup_window}", grafanaRollup, "{loop_rollup_window}", grafanaLoopRollup, "{minute_window}", grafanaMinutes, "{history_raw}", grafanaHistoryRaw, "{window}", grafanaWindow, "{events_window}", grafanaEventsWindow,
		"{bucket}", "toDateTime(intDiv(toUInt32(event_time), @interval_s) * @interval_s)",
		"{start_us}", fromUs, "{end_us}", endUs,
		"{db}", g.Database)
	return bindNames(sql, params), nil
}

// allOf is the conjunction of conds, "(1)" for none.
func allOf(conds []string) string {
	if len(conds) == 0 {
		return "(1)"
	}
	return "(" + strings.Join(conds, " AND ") + ")"
}

// anyValue is the condition, on constants, that the filter or toggle p
// (a variable v when isVar, else the literal lit) selects every row.
func anyValue(p Param, v Variable, isVar bool, lit string) string {
	ref := lit
	switch {
	case isVar && v.Multi:
		return "has(" + variableValues(v.Name) + ", '" + AllValue + "')"
	case isVar:
		ref = VariableText(v.Name)
	}
	if p.Hides != "" {
		return "(" + ref + " != 'yes')"
	}
	return "(" + ref + " = '')"
}

// bindNames replaces each @name with its text, matching whole names only.
func bindNames(sql string, pairs []string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return paramRef.ReplaceAllStringFunc(sql, func(ref string) string {
		if v, ok := m[ref]; ok {
			return v
		}
		return ref
	})
}
