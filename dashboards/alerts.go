package dashboards

import (
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/alerting"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/expr"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// RuleGroupName is the prefix of the alert rule group of the provisioning
// file: the group is RuleGroupName-<cluster> (RuleGroupFor), so that files
// generated for two clusters provision side by side.
const RuleGroupName = "stampguard"

// RunbookBase is where the rules' runbook_url annotations point: the
// README's runbook sections.
const RunbookBase = "https://github.com/stampguard/stampguard/blob/main/README.md#"

// RuleGroup is the alert rules, built with the SDK's alerting builders.
type RuleGroup struct {
	Name, Folder string
	Interval     time.Duration
	Rules        []alerting.Rule
	// Panels are the panel each rule links to ("view panel" in Grafana),
	// by rule UID: the SDK's Rule has no field for it.
	Panels map[string]PanelLink
}

// PanelLink is a dashboard panel: a rule's dashboardUid and panelId.
type PanelLink struct {
	DashboardUID string
	PanelID      int64
}

// The bases of the rules' UIDs; a rule's UID is its base and a hash of the
// cluster (RuleUID).
const (
	UIDConflictStorm     = "stampguard-conflict-storm"
	UIDClimbingConflicts = "stampguard-conflicts-climbing"
	UIDStaleRetryLoop    = "stampguard-stale-retry-loop"
	UIDAuditedStampless  = "stampguard-audit-stampless"
	UIDLostUpdates       = "stampguard-lost-updates"
	UIDSinkSpoolGrowth   = "stampguard-spool-growth"
)

// RetiredRuleUIDs are the UIDs of the rules that files generated before
// the per-cluster UIDs (RuleUID) provisioned: each rule had one fixed UID,
// and the sink's insert lag had a Grafana rule too. Every generated file
// deletes them (deleteRules), so that an upgrade leaves no rule of the old
// file evaluating beside its successor. No current UID is among them: a
// current one ends in the cluster's hash.
var RetiredRuleUIDs = []string{
	"stampguard-conflict-storm",
	"stampguard-climbing-conflicts",
	"stampguard-stale-retry-loop",
	"stampguard-audited-stampless-writes",
	"stampguard-sink-insert-lag",
	"stampguard-sink-spool-growth",
}

// RuleUID is the UID of the rule with UID base for cluster: base, a dash
// and 8 hex digits of the cluster name's FNV-1a hash. Grafana's UIDs are
// at most 40 characters of [A-Za-z0-9_-], which a cluster name need not
// be; the cluster itself is the rules' cluster label.
func RuleUID(base, cluster string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(cluster))
	return fmt.Sprintf("%s-%08x", base, h.Sum32())
}

// RuleGroupFor is the rule group of the rules watching cluster.
func RuleGroupFor(cluster string) string { return RuleGroupName + "-" + cluster }

var exprDS = func() common.DataSourceRef { return ref("__expr__", "__expr__") }()

// alertBinder renders statements for alert queries: no template
// variables; the cluster is the configured one and no filter narrows.
func (g *generator) alertBinder() asql.Grafana {
	a := g.o.Alerts
	return asql.Grafana{Database: g.o.Database, Values: map[string]string{
		asql.Cluster.Name:   "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(a.Cluster) + "'",
		asql.Namespace.Name: "''", asql.Resource.Name: "''", asql.User.Name: "''", asql.Name.Name: "''",
		asql.Verb.Name: "''", asql.Code.Name: "''", asql.HideSystem.Name: "'no'",
		asql.Top.Name:         "1000",
		asql.GapUs.Name:       fmt.Sprint(g.o.LoopGap.Microseconds()),
		asql.Threshold.Name:   fmt.Sprint(g.o.LoopThreshold),
		asql.MinHandoffs.Name: fmt.Sprint(g.o.FightHandoffs),
		asql.MinWrites.Name:   fmt.Sprint(a.MinWrites),
		asql.StaleUs.Name:     fmt.Sprint(a.LoopStale.Microseconds()),
	}}
}

// chQuery is an alert data query over s for [now-from, now-to].
func (g *generator) chQuery(ruleUID, refID string, s asql.Statement, from, to time.Duration) *alerting.QueryBuilder {
	sql, err := g.alertBinder().Bind(s)
	if err != nil {
		g.errs = append(g.errs, err)
	}
	sql = strings.TrimSpace(sql)
	f, t := int64(from/time.Second), int64(to/time.Second)
	g.queries = append(g.queries, Query{Name: "alert/" + ruleUID + "/" + refID, Statement: s, Shape: s.Shape, SQL: sql, Alert: true, From: f, To: t})
	ds := ref(PluginID, g.o.Alerts.ClickHouseUID)
	return alerting.NewQueryBuilder(refID).
		DatasourceUid(g.o.Alerts.ClickHouseUID).
		RelativeTimeRange(alerting.Duration(f), alerting.Duration(t)).
		Model(newClickHouseQuery(refID, ds, false, sql))
}

func (g *generator) promQuery(refID, promQL string, from time.Duration) *alerting.QueryBuilder {
	ds := ref("prometheus", g.o.Alerts.PrometheusUID)
	return alerting.NewQueryBuilder(refID).
		DatasourceUid(g.o.Alerts.PrometheusUID).
		RelativeTimeRange(alerting.Duration(from/time.Second), 0).
		Model(prometheus.NewDataqueryBuilder().Datasource(ds).RefId(refID).Expr(promQL).Instant())
}

func exprQuery(refID string, model cog.Builder[variants.Dataquery]) *alerting.QueryBuilder {
	return alerting.NewQueryBuilder(refID).DatasourceUid("__expr__").Model(model)
}

func reduce(refID, of string) *alerting.QueryBuilder {
	return exprQuery(refID, expr.NewExprBuilder().TypeReduce(expr.NewTypeReduceBuilder().
		RefId(refID).Datasource(exprDS).Expression(of).Reducer(expr.TypeReduceReducerLast)))
}

func above(refID, of string, v float64) *alerting.QueryBuilder {
	return exprQuery(refID, expr.NewExprBuilder().TypeThreshold(expr.NewTypeThresholdBuilder().
		RefId(refID).Datasource(exprDS).Expression(of).
		Conditions([]cog.Builder[expr.ExprTypeThresholdConditions]{
			expr.NewExprTypeThresholdConditionsBuilder().Evaluator(
				expr.NewExprTypeThresholdConditionsEvaluatorBuilder().Type(expr.ExprTypeThresholdConditionsEvaluatorTypeGt).Params([]float64{v})),
		})))
}

func mathExpr(refID, expression string) *alerting.QueryBuilder {
	return exprQuery(refID, expr.NewExprBuilder().TypeMath(expr.NewTypeMathBuilder().
		RefId(refID).Datasource(exprDS).Expression(expression)))
}

// ruleSpec is one rule: what the builder takes, and the panel it links to
// (a dashboard UID and a panel title of it).
type ruleSpec struct {
	uid, title, severity, runbook, summary, description string
	forDur                                              time.Duration
	condition                                           string
	dashboard, panel                                    string
	data                                                []cog.Builder[alerting.Query]
	noData                                              alerting.RuleNoDataState
}

func (g *generator) rule(r ruleSpec) *alerting.RuleBuilder {
	noData := r.noData
	if noData == "" {
		noData = alerting.RuleNoDataStateOK
	}
	return alerting.NewRuleBuilder(r.title).
		Uid(RuleUID(r.uid, g.o.Alerts.Cluster)).
		RuleGroup(RuleGroupFor(g.o.Alerts.Cluster)).
		FolderUID(g.o.Folder).
		OrgID(1).
		Condition(r.condition).
		Queries(r.data).
		For(duration(r.forDur)).
		NoDataState(noData).
		ExecErrState(alerting.RuleExecErrStateError).
		Labels(map[string]string{"severity": r.severity, "component": "stampguard", "cluster": g.o.Alerts.Cluster}).
		Annotations(map[string]string{
			"summary":     r.summary,
			"description": r.description,
			"runbook_url": RunbookBase + r.runbook,
		})
}

func data(qs ...cog.Builder[alerting.Query]) []cog.Builder[alerting.Query] { return qs }

func (g *generator) alertRules() (RuleGroup, error) {
	a := g.o.Alerts
	lag := a.IngestLag
	w := a.StormWindow
	base := a.ClimbBaseline
	specs := []ruleSpec{
		{uid: UIDConflictStorm, title: "Version-conflict storm", severity: "critical", runbook: "runbook-version-conflict-storm",
			summary: "Version conflicts above {{ humanizePercentage $values.B.Value }} of writes in cluster {{ $labels.cluster }}",
			description: fmt.Sprintf("In cluster %s, more than %g of write attempts over %s got 409 Conflict for a stale resourceVersion (at least %d writes; the window ends %s ago for ingestion lag).",
				a.Cluster, a.StormRate, duration(w), a.MinWrites, duration(lag)),
			forDur: a.StormFor, condition: "C", dashboard: UIDConflicts, panel: "Version-conflict rate",
			data: data(g.chQuery(UIDConflictStorm, "A", asql.ConflictRate, w+lag, lag), reduce("B", "A"), above("C", "B", a.StormRate))},

		// The baseline is the ClimbBaseline before the current window, and
		// counts only with MinWrites write attempts: after a quiet hour the
		// rate is 0 (ConflictRate below MinWrites), and any rate would be
		// "more than 3 times" it.
		{uid: UIDClimbingConflicts, title: "Version conflicts climbing", severity: "warning", runbook: "runbook-version-conflicts-climbing",
			summary: "The version-conflict rate in cluster {{ $labels.cluster }} is {{ humanizePercentage $values.C.Value }}, more than " + fmt.Sprint(a.ClimbFactor) + " times the " + duration(base) + " before ({{ humanizePercentage $values.D.Value }})",
			description: fmt.Sprintf("In cluster %s, the version-conflict rate over the last %s is above %g and more than %g times the rate over the %s before it, which had at least %d write attempts.",
				a.Cluster, duration(w), a.ClimbMinRate, a.ClimbFactor, duration(base), a.MinWrites),
			condition: "E", dashboard: UIDConflicts, panel: "Version-conflict rate",
			data: data(
				g.chQuery(UIDClimbingConflicts, "A", asql.ConflictRate, w+lag, lag),
				g.chQuery(UIDClimbingConflicts, "B", asql.ConflictRate, base+w+lag, w+lag),
				g.chQuery(UIDClimbingConflicts, "W", asql.WriteAttempts, base+w+lag, w+lag),
				reduce("C", "A"), reduce("D", "B"), reduce("F", "W"),
				mathExpr("E", fmt.Sprintf("$F >= %d && $C > %g && $C > %g * $D", a.MinWrites, a.ClimbMinRate, a.ClimbFactor)))},

		// One instance per writer and object (labels writer, namespace,
		// object), searched over LoopLookback so that a loop keeps firing
		// until its writer succeeds on the object.
		{uid: UIDStaleRetryLoop, title: "Unresolved retry loop", severity: "warning", runbook: "runbook-unresolved-retry-loop",
			summary: "{{ $labels.writer }} gave up on {{ $labels.object }} in namespace {{ $labels.namespace }} after {{ $values.B.Value }} version conflicts in retry loops",
			description: fmt.Sprintf("In cluster %s, a writer hit at least %d version conflicts in a row on one object (pauses under %s), and has had no success on it in the %s since its last conflict (loops searched over %s).",
				a.Cluster, g.o.LoopThreshold, duration(g.o.LoopGap), duration(a.LoopStale), duration(a.LoopLookback)),
			condition: "C", dashboard: UIDHotObjects, panel: "Unresolved retry loops",
			data: data(g.chQuery(UIDStaleRetryLoop, "A", asql.StaleRetryLoops, a.LoopLookback+lag, lag), reduce("B", "A"), above("C", "B", 0))},

		{uid: UIDAuditedStampless, title: "Stampless writes under an Audit policy", severity: "warning", runbook: "runbook-stampless-writes-under-audit",
			summary:     "{{ $values.B.Value }} stampless writes a policy in Audit mode would have denied, in cluster {{ $labels.cluster }}",
			description: fmt.Sprintf("In cluster %s, writes without a resourceVersion reached a kind a ConcurrencyPolicy guards while the policy is in Audit mode, over the last %s.", a.Cluster, duration(a.AuditWindow)),
			condition:   "C", dashboard: UIDPolicy, panel: "Stampless updates by writer",
			data: data(g.chQuery(UIDAuditedStampless, "A", asql.AuditedStamplessWrites, a.AuditWindow+lag, lag), reduce("B", "A"), above("C", "B", 0))},

		{uid: UIDLostUpdates, title: "Lost updates", severity: "warning", runbook: "runbook-lost-updates",
			summary: "{{ $values.B.Value }} lost updates in cluster {{ $labels.cluster }}: a change overwritten by a writer that had not seen it",
			description: fmt.Sprintf("In cluster %s, over the last %s, writes changed fields another writer had set without having seen them (a stampless update, kubectl replace's laundered stamp, a forced server-side apply, or a patch that replaced a list).",
				a.Cluster, duration(a.LostWindow)),
			condition: "C", dashboard: UIDHotObjects, panel: "Lost updates",
			data: data(g.chQuery(UIDLostUpdates, "A", asql.LostUpdateCount, a.LostWindow+lag, lag), reduce("B", "A"), above("C", "B", 0))},

		// The sink's insert lag pages from the chart's PrometheusRule
		// (AuditsinkInsertLag, at Alerts.InsertLag's 2m for 5m), not here
		// as well: one lag, one page.
		{uid: UIDSinkSpoolGrowth, title: "Audit sink spool growing", severity: "warning", runbook: "runbook-audit-sink-insert-lag-or-spool-growth",
			summary:     "The audit sink's spool grew by {{ humanize1024 $values.B.Value }}B in 15 minutes",
			description: fmt.Sprintf("auditsink_spool_bytes grew by more than %.0f bytes over 15 minutes: ClickHouse is not keeping up, and the spool's disk fills.", a.SpoolGrowth),
			forDur:      5 * time.Minute, condition: "C", dashboard: UIDHealth, panel: "Spool bytes", noData: alerting.RuleNoDataStateNoData,
			data: data(g.promQuery("A", `max(delta(auditsink_spool_bytes[15m]))`, 20*time.Minute), reduce("B", "A"), above("C", "B", a.SpoolGrowth))},
	}
	group := RuleGroup{Name: RuleGroupFor(a.Cluster), Folder: g.o.Folder, Interval: a.Interval, Panels: map[string]PanelLink{}}
	for _, spec := range specs {
		r, err := g.rule(spec).Build()
		if err != nil {
			return RuleGroup{}, fmt.Errorf("alert rule %s: %w", spec.uid, err)
		}
		id, ok := g.panels[spec.dashboard+"/"+spec.panel]
		if !ok {
			return RuleGroup{}, fmt.Errorf("alert rule %s: dashboard %s has no panel %q", spec.uid, spec.dashboard, spec.panel)
		}
		group.Panels[*r.Uid] = PanelLink{DashboardUID: spec.dashboard, PanelID: int64(id)}
		group.Rules = append(group.Rules, r)
	}
	return group, nil
}
