package sql

import (
	"fmt"
	"strings"
)

// Grafana renders statements for the Grafana ClickHouse data source
// (grafana-clickhouse-datasource): time becomes the plugin's macros, which
// its backend expands before the SQL reaches ClickHouse ($__fromTime and
// $__toTime are whole seconds and $__timeFilter includes both ends, so the
// window is [from, to + 1s) in microseconds), and parameters become
// Grafana template variables or literal values.
//
// Counting statements read request_rollup's whole hours inside the window
// from request_rollup_epoch on and the raw events for the rest; the
// retry-loop rows come from the tables of migration 3 from loop_epoch on
// and from events before it. Both splits are exact, as in the report, and
// so is the correction for events stored more than once (always applied:
// a panel cannot first ask whether the window holds a duplicate).
type Grafana struct {
	// Database holds the tables.
	Database string
	// Variables are the template variables that stand for parameters, by
	// parameter name.
	Variables map[string]Variable
	// Values are literal SQL for the parameters without a variable (a
	// number, or a quoted string; a filter's '' means any). interval_s
	// needs neither: it is always $__interval_s.
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

// AllValue is the custom "All" value of the filter variables: Grafana puts
// it into the SQL as it is, and the filters read it as "any".
const AllValue = `'__all__'`

// The window and the rollup's hours, from the plugin's macros. $__toTime
// is inclusive, so the window ends a second after it.
const (
	fromUs = `toUInt64(toUInt32($__fromTime)) * 1000000`
	endUs  = `(toUInt64(toUInt32($__toTime)) + 1) * 1000000`
	// days prunes day partitions with the days toDate gives event_date
	// (the server's time zone).
	days = `event_date >= toDate($__fromTime) AND event_date <= toDate($__toTime)`
	// grafanaWindow is the window on event_time_us (events and the
	// retry-loop tables); grafanaEventsWindow on events' event_time.
	grafanaWindow       = days + ` AND event_time_us >= ` + fromUs + ` AND event_time_us < ` + endUs
	grafanaEventsWindow = days + ` AND $__timeFilter(event_time)`
	// hoursFrom and hoursTo are the rollup's whole hours in seconds: from
	// the first whole hour in the window that request_rollup_epoch says is
	// complete, to the last whole hour that ends inside the window.
	hoursFrom     = `greatest(intDiv(toUInt32($__fromTime) + 3599, 3600) * 3600, (SELECT intDiv(toUInt32(max(complete_from)) + 3599, 3600) * 3600 FROM {db}.request_rollup_epoch))`
	hoursTo       = `intDiv(toUInt32($__toTime) + 1, 3600) * 3600`
	grafanaRollup = `hour >= toDateTime(` + hoursFrom + `) AND hour < toDateTime(` + hoursTo + `)`
	// grafanaRaw is the window minus the rollup's hours, as two edges on
	// event_time like the report's: [from, min(hoursFrom, to + 1s)) and
	// [max(hoursFrom, hoursTo), to]. Each prunes the day partitions it
	// does not span, and an empty one (a constant false first) reads none.
	edge1End   = `least(` + hoursFrom + `, toUInt32($__toTime) + 1)`
	edge2Start = `greatest(` + hoursFrom + `, ` + hoursTo + `)`
	grafanaRaw = `((` + edge1End + ` > toUInt32($__fromTime) AND event_date >= toDate($__fromTime) AND event_date <= toDate(toDateTime(` + edge1End + ` - 1))
			AND event_time >= $__fromTime AND event_time < toDateTime(` + edge1End + `))
		OR (` + edge2Start + ` <= toUInt32($__toTime) AND event_date >= toDate(toDateTime(` + edge2Start + `)) AND event_date <= toDate($__toTime)
			AND event_time >= toDateTime(` + edge2Start + `) AND event_time <= $__toTime))`
	// loopEpochUs is when the retry-loop tables hold every event;
	// beforeLoopEpoch keeps the raw forms to the events before it, with
	// their days (none when the tables hold everything).
	loopEpochUs     = `(SELECT toUInt64(toUInt32(max(complete_from))) * 1000000 FROM {db}.loop_epoch)`
	beforeLoopEpoch = `event_date <= toDate(toDateTime(intDiv(` + loopEpochUs + `, 1000000))) AND event_time_us < ` + loopEpochUs
)

// The retry-loop rows: the tables (as the report reads them) from
// loop_epoch on, their raw forms before it.
var (
	grafanaLoopConflicts = `(SELECT event_date, event_time_us, cluster, writer, api_group, resource, namespace, name FROM ` + loopConflictsTable + ` WHERE event_time_us >= ` + loopEpochUs + `
		UNION ALL
		SELECT event_date, event_time_us, cluster, writer, api_group, resource, namespace, name FROM ` + beforeEpoch(loopConflictsRaw) + `)`
	grafanaLoopConflictsUncorrected = `(SELECT event_date, event_time_us, cluster, writer, api_group, resource, namespace, name FROM ` + loopConflictsPlain + ` WHERE event_time_us >= ` + loopEpochUs + `
		UNION ALL
		SELECT event_date, event_time_us, cluster, writer, api_group, resource, namespace, name FROM ` + beforeEpoch(loopConflictsRawUncorrected) + `)`
	grafanaLoopSuccesses = `(SELECT event_date, event_time_us, cluster, pair FROM ` + loopSuccessesTable + ` WHERE event_time_us >= ` + loopEpochUs + `
		UNION ALL
		SELECT event_date, event_time_us, cluster, pair FROM ` + beforeEpoch(loopSuccessesRaw) + `)`
)

// beforeEpoch narrows a raw loop form's window to before loop_epoch, inside
// its PREWHERE or WHERE, where ClickHouse prunes by it.
func beforeEpoch(raw string) string {
	return strings.ReplaceAll(raw, EventsWhole.Placeholder, EventsWhole.Placeholder+" AND "+beforeLoopEpoch)
}

// Bind renders s for a Grafana panel or alert query. It fails when a
// parameter has neither a variable nor a value.
func (g Grafana) Bind(s Statement) (string, error) {
	var filters []string
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
		switch {
		case p.Column != "" && isVar && v.Multi:
			ref := "${" + v.Name + ":singlequote}"
			filters = append(filters, "("+AllValue+" IN ("+ref+") OR "+p.Column+" IN ("+ref+"))")
		case p.Column != "" && isVar:
			ref := "${" + v.Name + ":singlequote}"
			filters = append(filters, "("+ref+" = '' OR "+p.Column+" = "+ref+")")
		case p.Column != "":
			filters = append(filters, "("+lit+" = '' OR "+p.Column+" = "+lit+")")
		case isVar && p.Type == TypeString:
			params = append(params, "@"+p.Name, "${"+v.Name+":singlequote}")
		case isVar:
			params = append(params, "@"+p.Name, "${"+v.Name+"}")
		default:
			params = append(params, "@"+p.Name, lit)
		}
	}
	sql := replace(s.SQL,
		"{loop_conflicts}", grafanaLoopConflicts, "{loop_conflicts_uncorrected}", grafanaLoopConflictsUncorrected,
		"{loop_successes}", grafanaLoopSuccesses,
		"{duplicates}", corrected, "{duplicate_key}", identityKey,
		"{filters}", "("+strings.Join(filters, " AND ")+")",
		"{raw_window}", grafanaRaw, "{raw_sign}", "1", "{rollup_window}", grafanaRollup, "{window}", grafanaWindow, "{events_window}", grafanaEventsWindow,
		"{bucket}", "toDateTime(intDiv(toUInt32(event_time), @interval_s) * @interval_s)",
		"{end_us}", endUs,
		"{db}", g.Database)
	return bindNames(keyedReadRef.ReplaceAllString(correction(sql, true), ""), params), nil
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
