package dashboards

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/datasource"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Tag is on every dashboard; the dashboards link to each other through it.
const Tag = "stampguard"

// Query is one ClickHouse query the generated files send: a panel's
// target, a template variable's query, or an alert rule's data query.
type Query struct {
	// Name is "<dashboard uid>/<panel id>/<statement>",
	// "<dashboard uid>/var/<variable>", "<dashboard uid>/annotation/<statement>"
	// or "alert/<rule uid base>/<refId>".
	Name string
	// Statement is the analytics statement the query renders; zero for a
	// variable's query.
	Statement asql.Statement
	// Shape is what the panel needs back: a series (a time column first),
	// rows with Statement.Columns, or one number.
	Shape asql.Shape
	// SQL is the query as the file holds it: the plugin's macros and the
	// template variables unexpanded.
	SQL string
	// Alert is true for an alert rule's query; From and To are then its
	// relative time range (how long before now it starts and ends).
	Alert    bool
	From, To int64
}

// board is one dashboard being built.
type board struct {
	g      *generator
	uid    string
	b      *dashboard.DashboardBuilder //nolint:staticcheck // the classic model (newBoard says why)
	ds     common.DataSourceRef
	nextID uint32
	binder asql.Grafana
	// statements are the statement of each panel with a query, by id.
	statements map[uint32]asql.Statement
}

func ref(typ, uid string) common.DataSourceRef {
	return common.DataSourceRef{Type: &typ, Uid: &uid}
}

// clickHouseVariables are the filter variables of every ClickHouse
// dashboard, by parameter name.
var clickHouseVariables = map[string]asql.Variable{
	asql.Cluster.Name:    {Name: "cluster"},
	asql.Namespace.Name:  {Name: "namespace", Multi: true},
	asql.Resource.Name:   {Name: "resource", Multi: true},
	asql.User.Name:       {Name: "user", Multi: true},
	asql.Name.Name:       {Name: "name"},
	asql.Verb.Name:       {Name: "verb", Multi: true},
	asql.Code.Name:       {Name: "code", Multi: true},
	asql.HideSystem.Name: {Name: "hide_system"},
}

// Verbs are the verb variable's values: the apiserver's request verbs.
var Verbs = []string{"create", "update", "patch", "delete", "deletecollection", "get", "list", "watch"}

// RequestFiltersNote ends the description of every ClickHouse panel that
// the verb and code variables do not narrow.
const RequestFiltersNote = "The verb and code filters do not apply to this panel: it reads the hour caches or the field history, which keep neither."

func (g *generator) newBoard(uid, title, description string, tags ...string) *board {
	// The classic dashboard model (deprecated in the SDK for dashboardv2):
	// it is what Import, file provisioning and the sidecar read;
	// dashboardv2 needs Grafana 12's v2 API.
	b := dashboard.NewDashboardBuilder(title) //nolint:staticcheck
	b.
		Uid(uid).
		Description(description).
		Tags(append([]string{Tag}, tags...)).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Time("now-6h", "now").
		Refresh("1m").
		Timezone("browser").
		Link(dashboard.NewDashboardLinkBuilder("stampguard").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{Tag}).AsDropdown(true).IncludeVars(true).KeepTime(true))
	return &board{g: g, uid: uid, b: b, statements: map[uint32]asql.Statement{}}
}

// clickHouseBoard is a dashboard on the ClickHouse data source with the
// variables datasource, cluster, namespace, resource, user and name.
// PluginRequirement is said in every ClickHouse dashboard's description:
// before 4.0.3 the plugin expands $__fromTime to toDateTime64, which
// ClickHouse 18.16 lacks.
const PluginRequirement = "Needs grafana-clickhouse-datasource 4.0.3 or later."

func (g *generator) clickHouseBoard(uid, title, description string, tags ...string) *board {
	bd := g.newBoard(uid, title, description+" "+PluginRequirement, tags...)
	bd.ds = ref(PluginID, "${datasource}")
	bd.binder = asql.Grafana{Database: g.o.Database, Variables: clickHouseVariables, Values: map[string]string{
		asql.Top.Name:             fmt.Sprint(g.o.Top),
		asql.GapUs.Name:           fmt.Sprint(g.o.LoopGap.Microseconds()),
		asql.Threshold.Name:       fmt.Sprint(g.o.LoopThreshold),
		asql.MinHandoffs.Name:     fmt.Sprint(g.o.FightHandoffs),
		asql.MinWrites.Name:       fmt.Sprint(g.o.Alerts.MinWrites),
		asql.MinBucketWrites.Name: fmt.Sprint(g.o.MinBucketWrites),
		asql.StormS.Name:          fmt.Sprint(int64(g.o.Alerts.StormWindow / time.Second)),
		asql.StormRate.Name:       fmt.Sprint(g.o.Alerts.StormRate),
	}}
	bd.b.WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
		Label("ClickHouse").
		Type(PluginID))
	db := g.o.Database
	// The lists come from the hour caches (small), over the last week,
	// and from the events of the last three hours, which may not be
	// compacted yet.
	recent := func(col, where string) string {
		return `SELECT DISTINCT ` + col + ` FROM (
	SELECT ` + col + ` FROM ` + db + `.hour_requests WHERE event_date >= today() - 7` + where + `
	UNION ALL
	SELECT ` + col + ` FROM ` + db + `.` + asql.EventsTable + ` WHERE event_date >= today() - 1 AND event_time >= now() - 10800` + where + `
	UNION ALL
	SELECT ` + col + ` FROM ` + db + `.` + asql.LegacyEventsTable + ` WHERE event_date >= today() - 1 AND event_time >= now() - 10800` + where + `)
ORDER BY ` + col
	}
	bd.queryVariable("cluster", "Cluster", false, recent("cluster", ""))
	in := func(col string) string {
		return recent(col, ` AND cluster = `+asql.VariableText("cluster")+` AND `+col+` != ''`)
	}
	bd.queryVariable("namespace", "Namespace", true, in("namespace"))
	bd.queryVariable("resource", "Resource", true, in("resource"))
	bd.queryVariable("user", "Writer", true, in("writer"))
	all := "$__all"
	allOption := dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: strPtr("All")}, Value: dashboard.StringOrArrayOfString{String: &all}}
	verbs := strings.Join(Verbs, ",")
	bd.b.WithVariable(dashboard.NewCustomVariableBuilder("verb").
		Label("Verb").
		Description("Narrows the panels that read raw events (each other panel says so) to these verbs").
		Values(dashboard.StringOrMap{String: &verbs}).
		Multi(true).IncludeAll(true).AllValue(asql.AllValue).Current(allOption))
	// The codes answered over the last day: only events keep them.
	codes := `SELECT DISTINCT toString(code) AS code FROM (
	SELECT code FROM ` + db + `.` + asql.EventsTable + ` WHERE event_date >= today() - 1 AND event_time >= now() - 86400 AND cluster = ` + asql.VariableText("cluster") + `
	UNION ALL
	SELECT code FROM ` + db + `.` + asql.LegacyEventsTable + ` WHERE event_date >= today() - 1 AND event_time >= now() - 86400 AND cluster = ` + asql.VariableText("cluster") + `)
ORDER BY code`
	bd.queryVariable("code", "Response code", true, codes)
	no, yes := "no", "yes"
	bd.b.WithVariable(dashboard.NewCustomVariableBuilder("hide_system").
		Label("Hide Kubernetes' own writers").
		Description("yes hides the control plane's and the nodes' system: users and kube-system's service accounts; other service accounts stay").
		Values(dashboard.StringOrMap{String: strPtr(no + "," + yes)}).AllowCustomValue(false).
		Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: &no}, Value: dashboard.StringOrArrayOfString{String: &no}}))
	empty := ""
	bd.b.WithVariable(dashboard.NewTextBoxVariableBuilder("name").
		Label("Object name").
		Description("One object's name; empty for every object").
		DefaultValue(dashboard.StringOrMap{String: &empty}))
	return bd
}

// queryVariable adds a ClickHouse query variable; a multi-value one has
// "All", whose custom value the filters read as any.
func (bd *board) queryVariable(name, label string, multi bool, sql string) {
	v := dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(bd.ds).
		Query(dashboard.StringOrMap{Map: map[string]any{"refId": name, "queryType": "sql", "rawSql": sql}}).
		// The lists read the last week whatever the range: once per
		// load, not on every change of the time range.
		Refresh(dashboard.VariableRefreshOnDashboardLoad).
		Sort(dashboard.VariableSortAlphabeticalAsc)
	if multi {
		all := "$__all"
		v.Multi(true).IncludeAll(true).AllValue(asql.AllValue).
			Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: strPtr("All")}, Value: dashboard.StringOrArrayOfString{String: &all}})
	}
	bd.b.WithVariable(v)
	bd.g.queries = append(bd.g.queries, Query{Name: bd.uid + "/var/" + name, Shape: asql.Rows, SQL: sql})
}

func strPtr(s string) *string { return &s }

// target renders s as the panel's query and records it.
func (bd *board) target(id uint32, s asql.Statement) cog.Builder[variants.Dataquery] {
	bd.statements[id] = s
	return bd.query(fmt.Sprintf("%s/%d/%s", bd.uid, id, s.Name), "A", s)
}

func (bd *board) query(name, refID string, s asql.Statement) clickHouseQuery {
	sql, err := bd.binder.Bind(s)
	if err != nil {
		bd.g.errs = append(bd.g.errs, err)
	}
	sql = strings.TrimSpace(sql)
	bd.g.queries = append(bd.g.queries, Query{Name: name, Statement: s, Shape: s.Shape, SQL: sql})
	return newClickHouseQuery(refID, bd.ds, s.Shape == asql.Series, sql)
}

// annotation adds an annotation query over s (columns time, timeEnd and
// text), shown on every time series of the dashboard.
func (bd *board) annotation(name, color string, s asql.Statement) {
	bd.b.Annotation(dashboard.NewAnnotationQueryBuilder().
		Name(name).Datasource(bd.ds).Enable(true).IconColor(color).
		Target(bd.query(bd.uid+"/annotation/"+s.Name, "Annotations", s)))
}

func (bd *board) id() uint32 {
	bd.nextID++
	return bd.nextID
}

// titled is id() for a panel with a title, which rules can link to.
func (bd *board) titled(title string) uint32 {
	id := bd.id()
	if _, ok := bd.g.panels[bd.uid+"/"+title]; !ok {
		bd.g.panels[bd.uid+"/"+title] = id
	}
	return id
}

func legend() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().
		DisplayMode(common.LegendDisplayModeTable).
		Placement(common.LegendPlacementBottom).
		ShowLegend(true).
		Calcs([]string{"mean", "max", "lastNotNull"})
}

func tooltip() *common.VizTooltipOptionsBuilder {
	return common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)
}

func thresholds(steps ...any) *dashboard.ThresholdsConfigBuilder {
	var ts []dashboard.Threshold
	for i := 0; i+1 < len(steps); i += 2 {
		var v *float64
		if f, ok := steps[i].(float64); ok {
			v = &f
		}
		ts = append(ts, dashboard.Threshold{Value: v, Color: steps[i+1].(string)})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(ts)
}

// describe is the description of a panel over s: with RequestFiltersNote
// when the verb and code filters do not narrow s.
func describe(description string, s asql.Statement) string {
	if slices.Contains(s.Params, asql.Verb) {
		return description
	}
	return description + " " + RequestFiltersNote
}

// series is a time-series panel over s.
func (bd *board) series(title, description string, s asql.Statement, unit string, w, h uint32) *timeseries.PanelBuilder {
	id := bd.titled(title)
	p := timeseries.NewPanelBuilder().Id(id).Title(title).Description(describe(description, s)).
		Datasource(bd.ds).WithTarget(bd.target(id, s)).
		Unit(unit).Span(w).Height(h).
		// Buckets of at least a minute: narrower ones hold a handful of
		// requests, and their rates jump between 0 and 100 %.
		Interval(MinInterval).
		Legend(legend()).Tooltip(tooltip()).
		LineWidth(1).FillOpacity(10).
		Thresholds(thresholds(nil, "green"))
	return p
}

// MinInterval is the ClickHouse time series' minimum interval: their
// $__interval_s is never below it.
const MinInterval = "1m"

// table is a table panel over s.
func (bd *board) table(title, description string, s asql.Statement, w, h uint32) *table.PanelBuilder {
	id := bd.titled(title)
	p := table.NewPanelBuilder().Id(id).Title(title).Description(describe(description, s)).
		Datasource(bd.ds).WithTarget(bd.target(id, s)).
		Span(w).Height(h).Filterable(true).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"})).
		Thresholds(thresholds(nil, "green"))
	for _, c := range s.Columns {
		if c == "conflict_rate" {
			p.OverrideByName(c, []dashboard.DynamicConfigValue{{Id: "unit", Value: units.PercentUnit}, {Id: "displayName", Value: "conflict rate"}})
		}
	}
	return p
}

// stat is a stat panel showing one column of s.
func (bd *board) stat(title, description string, s asql.Statement, column, unit string, w, h uint32, th *dashboard.ThresholdsConfigBuilder) *stat.PanelBuilder {
	id := bd.titled(title)
	return stat.NewPanelBuilder().Id(id).Title(title).Description(describe(description, s)).
		Datasource(bd.ds).WithTarget(bd.target(id, s)).
		Unit(unit).Span(w).Height(h).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Fields("/^" + column + "$/")).
		ColorMode(common.BigValueColorModeValue).GraphMode(common.BigValueGraphModeNone).
		Thresholds(th)
}

// sharedStat is a stat panel showing one column of panel source's
// results, through the "-- Dashboard --" data source: no query of its own.
func (bd *board) sharedStat(title, description string, source uint32, column, unit string, w, h uint32, th *dashboard.ThresholdsConfigBuilder) *stat.PanelBuilder {
	id := bd.titled(title)
	ds := ref("datasource", DashboardDatasource)
	return stat.NewPanelBuilder().Id(id).Title(title).Description(describe(description, bd.statements[source])).
		Datasource(ds).WithTarget(datasource.NewDataqueryBuilder().RefId("A").Datasource(ds).PanelId(source).WithTransforms(false)).
		Unit(unit).Span(w).Height(h).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Fields("/^" + column + "$/")).
		ColorMode(common.BigValueColorModeValue).GraphMode(common.BigValueGraphModeNone).
		Thresholds(th)
}

// link filters this dashboard to one object or one writer: the url's
// variables come from the clicked row.
func (bd *board) link(title string, vars ...string) dashboard.DynamicConfigValue {
	q := []string{"${__url_time_range}", "var-datasource=${datasource:percentencode}", "var-cluster=${cluster:percentencode}"}
	for i := 0; i+1 < len(vars); i += 2 {
		q = append(q, "var-"+vars[i]+"=${__data.fields."+vars[i+1]+":percentencode}")
	}
	return dashboard.DynamicConfigValue{Id: "links", Value: []map[string]any{{
		"title": title, "url": "/d/" + bd.uid + "?" + strings.Join(q, "&"),
	}}}
}

// promBoard is a dashboard on a Prometheus data source variable.
func (g *generator) promBoard(uid, title, description string, tags ...string) *board {
	bd := g.newBoard(uid, title, description, tags...)
	bd.ds = ref("prometheus", "${datasource}")
	bd.b.WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus"))
	return bd
}

// promSeries is a time-series panel of PromQL expressions, each with its
// legend.
func (bd *board) promSeries(title, description, unit string, w, h uint32, exprs ...string) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Id(bd.titled(title)).Title(title).Description(description).
		Datasource(bd.ds).Unit(unit).Span(w).Height(h).
		Legend(legend()).Tooltip(tooltip()).LineWidth(1).FillOpacity(10).
		Thresholds(thresholds(nil, "green"))
	for i := 0; i+1 < len(exprs); i += 2 {
		p.WithTarget(prometheus.NewDataqueryBuilder().
			Datasource(bd.ds).
			RefId(string(rune('A' + i/2))).
			Expr(exprs[i]).
			LegendFormat(exprs[i+1]).
			Range())
	}
	return p
}

func (bd *board) add(p cog.Builder[dashboard.Panel]) {
	bd.b.WithPanel(p)
}

func (bd *board) row(title string) {
	bd.b.WithRow(dashboard.NewRowBuilder(title).Id(bd.id()))
}

// Expanded is every ClickHouse query of the generated files, by Query.Name,
// with e applied as Grafana and the plugin apply it: the SQL that reaches
// ClickHouse. Tests run it on ClickHouse 18.16, and a suite on a current
// release can run the same list.
func (g *Generated) Expanded(e asql.Expansion) (map[string]string, error) {
	out := make(map[string]string, len(g.Queries))
	for _, q := range g.Queries {
		sql, err := e.Expand(q.SQL)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", q.Name, err)
		}
		out[q.Name] = sql
	}
	return out, nil
}
