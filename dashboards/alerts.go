package dashboards

import (
	"fmt"
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

// RuleGroupName is the alert rule group of the provisioning file.
const RuleGroupName = "stampguard"

// RunbookBase is where the rules' runbook_url annotations point: the
// README's runbook sections.
const RunbookBase = "https://github.com/stampguard/stampguard/blob/main/README.md#"

// RuleGroup is the alert rules, built with the SDK's alerting builders.
type RuleGroup struct {
	Name, Folder string
	Interval     time.Duration
	Rules        []alerting.Rule
}

// The rules' UIDs.
const (
	UIDConflictStorm     = "stampguard-conflict-storm"
	UIDClimbingConflicts = "stampguard-climbing-conflicts"
	UIDStaleRetryLoop    = "stampguard-stale-retry-loop"
	UIDAuditedStampless  = "stampguard-audited-stampless-writes"
	UIDSinkSpoolGrowth   = "stampguard-sink-spool-growth"
)

var exprDS = func() common.DataSourceRef { return ref("__expr__", "__expr__") }()

// alertBinder renders statements for alert queries: no template
// variables; the cluster is the configured one and no filter narrows.
func (g *generator) alertBinder() asql.Grafana {
	a := g.o.Alerts
	return asql.Grafana{Database: g.o.Database, Values: map[string]string{
		asql.Cluster.Name:   "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(a.Cluster) + "'",
		asql.Namespace.Name: "''", asql.Resource.Name: "''", asql.User.Name: "''", asql.Name.Name: "''",
		asql.Top.Name:       "1000",
		asql.GapUs.Name:     fmt.Sprint(g.o.LoopGap.Microseconds()),
		asql.Threshold.Name: fmt.Sprint(g.o.LoopThreshold),
		asql.MinWrites.Name: fmt.Sprint(a.MinWrites),
		asql.StaleUs.Name:   fmt.Sprint(a.LoopStale.Microseconds()),
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

func (g *generator) rule(uid, title, severity, runbook, summary, description string, forDur time.Duration, condition string, data ...cog.Builder[alerting.Query]) *alerting.RuleBuilder {
	return alerting.NewRuleBuilder(title).
		Uid(uid).
		RuleGroup(RuleGroupName).
		FolderUID(g.o.Folder).
		OrgID(1).
		Condition(condition).
		Queries(data).
		For(duration(forDur)).
		NoDataState(alerting.RuleNoDataStateOK).
		ExecErrState(alerting.RuleExecErrStateError).
		Labels(map[string]string{"severity": severity, "component": "stampguard"}).
		Annotations(map[string]string{
			"summary":     summary,
			"description": description,
			"runbook_url": RunbookBase + runbook,
		})
}

func (g *generator) alertRules() (RuleGroup, error) {
	a := g.o.Alerts
	lag := a.IngestLag
	w := a.StormWindow
	builders := []*alerting.RuleBuilder{
		g.rule(UIDConflictStorm, "Version-conflict storm", "critical", "runbook-version-conflict-storm",
			"Version conflicts above {{ humanizePercentage $values.B.Value }} of writes",
			fmt.Sprintf("In cluster %s, more than %g of write attempts over %s got 409 Conflict for a stale resourceVersion (at least %d writes; the window ends %s ago for ingestion lag).",
				a.Cluster, a.StormRate, duration(w), a.MinWrites, duration(lag)),
			a.StormFor, "C",
			g.chQuery(UIDConflictStorm, "A", asql.ConflictRate, w+lag, lag), reduce("B", "A"), above("C", "B", a.StormRate)),

		g.rule(UIDClimbingConflicts, "Version conflicts climbing", "warning", "runbook-version-conflicts-climbing",
			"The version-conflict rate is more than "+fmt.Sprint(a.ClimbFactor)+" times an hour ago",
			fmt.Sprintf("In cluster %s, the version-conflict rate over the last %s is above %g and more than %g times the rate over the same window an hour earlier.",
				a.Cluster, duration(w), a.ClimbMinRate, a.ClimbFactor),
			0, "E",
			g.chQuery(UIDClimbingConflicts, "A", asql.ConflictRate, w+lag, lag),
			g.chQuery(UIDClimbingConflicts, "B", asql.ConflictRate, time.Hour+w+lag, time.Hour+lag),
			reduce("C", "A"), reduce("D", "B"),
			mathExpr("E", fmt.Sprintf("$C > %g && $C > %g * $D", a.ClimbMinRate, a.ClimbFactor))),

		g.rule(UIDStaleRetryLoop, "Unresolved retry loop", "warning", "runbook-unresolved-retry-loop",
			"{{ $values.B.Value }} writers gave up in a retry loop",
			fmt.Sprintf("In cluster %s, a writer hit at least %d version conflicts in a row on one object (pauses under %s), and has had no success on it in the %s since its last conflict.",
				a.Cluster, g.o.LoopThreshold, duration(g.o.LoopGap), duration(a.LoopStale)),
			0, "C",
			g.chQuery(UIDStaleRetryLoop, "A", asql.StaleRetryLoops, a.LoopLookback+lag, lag), reduce("B", "A"), above("C", "B", 0)),

		g.rule(UIDAuditedStampless, "Stampless writes under an Audit policy", "warning", "runbook-stampless-writes-under-audit",
			"{{ $values.B.Value }} stampless writes a policy in Audit mode would have denied",
			fmt.Sprintf("In cluster %s, writes without a resourceVersion reached a kind a ConcurrencyPolicy guards while the policy is in Audit mode, over the last %s.", a.Cluster, duration(a.AuditWindow)),
			0, "C",
			g.chQuery(UIDAuditedStampless, "A", asql.AuditedStamplessWrites, a.AuditWindow+lag, lag), reduce("B", "A"), above("C", "B", 0)),

		// The sink's insert lag pages from the chart's PrometheusRule
		// (AuditsinkInsertLag, at Alerts.InsertLag's 2m for 5m), not here
		// as well: one lag, one page.

		g.rule(UIDSinkSpoolGrowth, "Audit sink spool growing", "warning", "runbook-audit-sink-insert-lag-or-spool-growth",
			"The audit sink's spool grew by {{ humanize1024 $values.B.Value }}B in 15 minutes",
			fmt.Sprintf("auditsink_spool_bytes grew by more than %.0f bytes over 15 minutes: ClickHouse is not keeping up, and the spool's disk fills.", a.SpoolGrowth),
			5*time.Minute, "C",
			g.promQuery("A", `max(delta(auditsink_spool_bytes[15m]))`, 20*time.Minute), reduce("B", "A"), above("C", "B", a.SpoolGrowth)).
			NoDataState(alerting.RuleNoDataStateNoData),
	}
	group := RuleGroup{Name: RuleGroupName, Folder: g.o.Folder, Interval: a.Interval}
	for _, b := range builders {
		r, err := b.Build()
		if err != nil {
			return RuleGroup{}, fmt.Errorf("alert rule: %w", err)
		}
		group.Rules = append(group.Rules, r)
	}
	return group, nil
}
