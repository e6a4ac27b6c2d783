package dashboards

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/units"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// The dashboards' UIDs: stable, so links and bookmarks survive updates.
const (
	UIDConflicts  = "stampguard-conflicts"
	UIDHotObjects = "stampguard-hot-objects"
	UIDPolicy     = "stampguard-policy"
	UIDLeases     = "stampguard-leases"
	UIDHealth     = "stampguard-health"
)

// databaseName is a database the SQL can name without quoting.
var databaseName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type generator struct {
	o       Options
	queries []Query
	errs    []error
	// panels are the panels' ids by "<dashboard uid>/<title>", the first
	// of a title: what a rule links to.
	panels map[string]uint32
}

// Generated is the generator's output.
type Generated struct {
	// Options are the parameters it was generated with, defaults applied.
	Options Options
	// Dashboards are the five dashboards, in UID order of Files.
	Dashboards []dashboard.Dashboard //nolint:staticcheck // the classic model: what Import, file provisioning and the sidecar read
	// Rules is the alert rule group.
	Rules RuleGroup
	// Queries are every ClickHouse query of the dashboards and the rules.
	Queries []Query
}

// Generate builds the dashboards and the alert rules.
func Generate(o Options) (*Generated, error) {
	o.setDefaults()
	if !databaseName.MatchString(o.Database) {
		return nil, fmt.Errorf("database name %q: want letters, digits and underscores", o.Database)
	}
	if o.Alerts.StormRate >= 1 || o.Alerts.ClimbMinRate >= 1 || o.BaselineConflictRate >= 1 {
		return nil, fmt.Errorf("conflict rates are fractions of the writes, below 1: storm %g, climb minimum %g, baseline %g",
			o.Alerts.StormRate, o.Alerts.ClimbMinRate, o.BaselineConflictRate)
	}
	g := &generator{o: o, panels: map[string]uint32{}}
	var out Generated
	out.Options = o
	for _, build := range []func() *board{g.conflicts, g.hotObjects, g.policy, g.leases, g.health} {
		bd := build()
		d, err := bd.b.Build()
		if err != nil {
			return nil, fmt.Errorf("dashboard %s: %w", bd.uid, err)
		}
		out.Dashboards = append(out.Dashboards, d)
	}
	rules, err := g.alertRules()
	if err != nil {
		return nil, err
	}
	out.Rules = rules
	if err := errors.Join(g.errs...); err != nil {
		return nil, err
	}
	out.Queries = g.queries
	return &out, nil
}

// countsPerSecond is Grafana's unit "counts/sec": the SDK's units have
// no constant for it.
const countsPerSecond = "cps"

func (g *generator) rateThresholds() *dashboard.ThresholdsConfigBuilder {
	return thresholds(nil, "green", g.o.BaselineConflictRate, "orange", g.o.Alerts.StormRate, "red")
}

func (g *generator) conflicts() *board {
	bd := g.clickHouseBoard(UIDConflicts, "stampguard: conflicts overview",
		"Version conflicts (409) and their kinds, stampless updates, expired lists and write latency, from the apiserver's audit log.", "conflicts")
	bd.annotation("Version-conflict storms", "red", asql.StormIntervals)
	// One totals query: the first stat's; the others show its columns.
	bd.add(bd.stat("Version-conflict rate", "Version conflicts per write attempt over the range.", asql.Totals, "conflict_rate", units.PercentUnit, 6, 4, g.rateThresholds()))
	totals := bd.nextID
	bd.add(bd.sharedStat("Write attempts", "Create, update, patch and delete requests (dry runs excluded).", totals, "write_attempts", units.Short, 6, 4, thresholds(nil, "blue")))
	bd.add(bd.sharedStat("Version conflicts", "409 Conflict answers for a stale resourceVersion.", totals, "version_conflicts", units.Short, 6, 4, thresholds(nil, "green", 1.0, "orange")))
	bd.add(bd.sharedStat("Stampless updates", "Successful updates that sent no resourceVersion: they overwrite whatever was there.", totals, "stampless_updates", units.Short, 6, 4, thresholds(nil, "green", 1.0, "orange")))

	rate := bd.series("Version-conflict rate",
		fmt.Sprintf("Version conflicts per write attempt in each interval (of at least %s, with at least %d write attempts); the line is the healthy baseline (%g).", MinInterval, g.o.MinBucketWrites, g.o.BaselineConflictRate),
		asql.ConflictRateSeries, units.PercentUnit, 24, 8).
		Thresholds(thresholds(nil, "transparent", g.o.BaselineConflictRate, "red")).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine)).
		AxisSoftMin(0)
	bd.add(rate)
	bd.add(bd.series("Conflicts by kind", "409 answers per second in each interval, every 409 classified once: version (stale resourceVersion), field (server-side apply manager conflict), delete precondition, already exists, other.",
		asql.ConflictKindsSeries, units.RequestsPerSecond, 12, 8).
		DrawStyle(common.GraphDrawStyleBars).Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)))
	bd.add(bd.series("Stampless updates and 410 Gone", "Per second in each interval: updates without a resourceVersion that succeeded, and lists or watches whose resourceVersion had expired.",
		asql.StamplessGoneSeries, units.RequestsPerSecond, 12, 8).DrawStyle(common.GraphDrawStyleBars))
	bd.add(bd.series("Write latency by resource (p50, p99)", "From requestReceivedTimestamp to the stage timestamp of each write, per resource.",
		asql.WriteLatencySeries, units.Seconds, 24, 8))

	bd.row("Where the conflicts are")
	bd.add(bd.table("By resource", "Write attempts and version conflicts per resource.", asql.ConflictsByResource, 12, 8))
	bd.add(bd.table("By namespace", "Write attempts and version conflicts per namespace.", asql.ConflictsByNamespace, 12, 8))
	bd.add(bd.table("By writer", "Write attempts and version conflicts per writer (the impersonated user, else the user).", asql.ConflictsByUser, 12, 8).
		OverrideByName("user", []dashboard.DynamicConfigValue{bd.link("Filter to this writer", "user", "user")}))
	bd.add(bd.table("By user agent", "Write attempts and version conflicts per client user agent.", asql.ConflictsByUserAgent, 12, 8))
	bd.add(bd.table("410 Gone by writer", "Who gets 410 Gone: lists and watches whose resourceVersion had expired, per writer and resource (each is a relist from scratch).", asql.GoneByWriter, 24, 8).
		OverrideByName("user", []dashboard.DynamicConfigValue{bd.link("Filter to this writer", "user", "user")}))
	return bd
}

func (g *generator) hotObjects() *board {
	bd := g.clickHouseBoard(UIDHotObjects, "stampguard: hot objects and retry loops",
		"The objects most written and fought over, the updates lost on them, and writers looping on version conflicts. Click a name or writer to filter every panel to it.", "conflicts", "retry-loops")
	objectLink := bd.link("Filter to this object", "namespace", "namespace", "resource", "resource", "name", "name")
	writerLink := bd.link("Filter to this writer", "user", "user")
	bd.add(bd.table("Hot objects", "Objects ranked by version conflicts, then distinct writers, then write attempts.", asql.HotObjects, 24, 9).
		OverrideByName("n", []dashboard.DynamicConfigValue{{Id: "displayName", Value: "name"},
			bd.link("Filter to this object", "namespace", "ns", "resource", "r", "name", "n")}).
		OverrideByName("g", []dashboard.DynamicConfigValue{{Id: "displayName", Value: "api group"}}).
		OverrideByName("r", []dashboard.DynamicConfigValue{{Id: "displayName", Value: "resource"}}).
		OverrideByName("ns", []dashboard.DynamicConfigValue{{Id: "displayName", Value: "namespace"}}))
	bd.add(bd.table("Lost updates", "Writes that changed a field another writer had set, without having seen it: a stampless update, kubectl replace's laundered stamp, a forced server-side apply, or a patch that replaced a list (docs/auditsink.md, Lost updates). Times in Unix microseconds.", asql.LostUpdates, 24, 8).
		OverrideByName("writer", []dashboard.DynamicConfigValue{writerLink}).
		OverrideByName("name", []dashboard.DynamicConfigValue{objectLink}))
	bd.add(bd.table("Field fights", fmt.Sprintf("Fields of one object that changed hands between writers at least %d times: two honest writers setting one field back and forth (the HPA and a GitOps tool on spec.replicas). Times in Unix microseconds.", g.o.FightHandoffs), asql.FieldFights, 24, 7).
		OverrideByName("name", []dashboard.DynamicConfigValue{objectLink}))
	bd.add(bd.table("Who caused the version conflicts", "For each version conflict on an object with a field history, the writers whose writes came between the stale stamp and the 409 (blocked_by empty: not in the history).", asql.ConflictCauses, 12, 8).
		OverrideByName("writer", []dashboard.DynamicConfigValue{writerLink}))
	bd.add(bd.table("Writes that stored nothing", "Writes the apiserver answered with the version it already held, per writer: the same state sent again, which still wakes every watcher.", asql.NoopWrites, 12, 8).
		OverrideByName("user", []dashboard.DynamicConfigValue{writerLink}))
	bd.add(bd.table("Field writers", "Who changes which field, per kind and namespace: each writer's changes of a field (a new value, creations excluded), on how many objects, first and last; the busiest first. A field with one writer and a few intruders is a field-owner policy waiting to be written. Times in Unix microseconds.", asql.FieldWriters, 24, 8).
		OverrideByName("writer", []dashboard.DynamicConfigValue{writerLink}))
	loops := func(title, description string, s asql.Statement) {
		bd.add(bd.table(title, description, s, 24, 8).
			OverrideByName("user", []dashboard.DynamicConfigValue{writerLink}).
			OverrideByName("name", []dashboard.DynamicConfigValue{objectLink}))
	}
	loops("Unresolved retry loops", fmt.Sprintf("Runs of at least %d version conflicts by one writer on one object, no pause longer than %s, with no success by that writer on that object after the last conflict.",
		g.o.LoopThreshold, duration(g.o.LoopGap)), asql.UnresolvedRetryLoops)
	loops("Resolved retry loops", "Retry loops that ended with a success by the same writer on the same object.", asql.ResolvedRetryLoops)
	bd.add(bd.series("Version-conflict rate", fmt.Sprintf("Version conflicts per write attempt, for the filtered object or writer (intervals with at least %d write attempts).", g.o.MinBucketWrites), asql.ConflictRateSeries, units.PercentUnit, 24, 7).
		Thresholds(thresholds(nil, "transparent", g.o.BaselineConflictRate, "red")).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine)))
	bd.add(bd.table("Audit events", "The requests themselves, newest first (at most 500): click a hot object, a loop's object or a writer above to see what the audit log recorded for it; the verb and code variables narrow it.", asql.RawEvents, 24, 12))
	return bd
}

func (g *generator) policy() *board {
	bd := g.clickHouseBoard(UIDPolicy, "stampguard: policy enforcement",
		"What the stampguard webhook decided, from its audit annotations: by policy, rule kind and action. Under Audit, a decision is a write it would have denied.", "policy")
	actions := []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: map[string]dashboard.ValueMappingResult{
		"deny":  {Text: strPtr("denied"), Color: strPtr("red")},
		"warn":  {Text: strPtr("warned"), Color: strPtr("orange")},
		"audit": {Text: strPtr("would have denied (Audit)"), Color: strPtr("yellow")},
	}}}}
	bd.add(bd.series("Decisions by action", "stampguard decisions per second in each interval: denied, warned, and would have denied (Audit).", asql.PolicyDecisionsSeries, countsPerSecond, 24, 8).
		DrawStyle(common.GraphDrawStyleBars).Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)))
	bd.add(bd.table("Decisions by policy, rule kind and action", "One row per policy, rule kind (stamp-missing, field-owner, immutable-field, delete-precondition) and action.", asql.PolicyDecisions, 14, 9).
		OverrideByName("action", []dashboard.DynamicConfigValue{{Id: "mappings", Value: actions}, {Id: "custom.cellOptions", Value: map[string]any{"type": "color-text"}}}))
	bd.add(bd.table("Stampless updates by writer", "Successful updates without a resourceVersion, per writer.", asql.StamplessByWriter, 10, 9).
		OverrideByName("user", []dashboard.DynamicConfigValue{bd.link("Filter to this writer", "user", "user")}))
	bd.add(bd.table("Stampless updates by object", "Successful updates without a resourceVersion, per writer and object.", asql.StamplessUpdates, 24, 8))
	return bd
}

func (g *generator) leases() *board {
	bd := g.clickHouseBoard(UIDLeases, "stampguard: leader election",
		"Lease holder changes and version conflicts on coordination.k8s.io leases.", "leases")
	bd.add(bd.table("Lease holder changes", "Per lease, the runs of its holder in time order; every run after the first is a change (A, B, A is two changes).", asql.LeaseHolderChanges, 12, 10).
		OverrideByName("changes", []dashboard.DynamicConfigValue{{Id: "custom.cellOptions", Value: map[string]any{"type": "color-background"}}}).
		Thresholds(thresholds(nil, "green", 2.0, "orange", 10.0, "red")))
	bd.add(bd.table("Version conflicts on leases", "Write attempts and version conflicts per lease: candidates racing, or renewing from a stale read.", asql.LeaseConflicts, 12, 10))
	bd.add(bd.series("Lease holder changes over time", "Holder changes per second in each interval, per lease (as in the table: a holder other than the lease's previous one in the range).", asql.LeaseChangesSeries, countsPerSecond, 24, 8).
		DrawStyle(common.GraphDrawStyleBars).Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)))
	return bd
}

func (g *generator) health() *board {
	bd := g.promBoard(UIDHealth, "stampguard: health",
		"The webhook's admission traffic and the audit sink's pipeline, from their Prometheus metrics.", "health")
	bd.row("Webhook")
	bd.add(bd.promSeries("Admission rate", "AdmissionReviews per second, by endpoint (stamp, fields).", units.RequestsPerSecond, 12, 8,
		`sum by (endpoint) (rate(stampguard_admission_requests_total[$__rate_interval]))`, "{{endpoint}}"))
	bd.add(bd.promSeries("Denials by policy", "Violations that denied the request, by policy and rule kind.", units.RequestsPerSecond, 12, 8,
		`sum by (policy, rule) (rate(stampguard_admission_decisions_total{outcome="denied"}[$__rate_interval]))`, "{{policy}} {{rule}}",
		`sum by (policy, rule) (rate(stampguard_admission_decisions_total{action="Audit"}[$__rate_interval]))`, "{{policy}} {{rule}} (Audit: would have denied)"))
	bd.add(bd.promSeries("Evaluation latency", "Time from reading an AdmissionReview to writing the answer.", units.Seconds, 12, 8,
		`histogram_quantile(0.5, sum by (le, endpoint) (rate(stampguard_admission_evaluation_seconds_bucket[$__rate_interval])))`, "p50 {{endpoint}}",
		`histogram_quantile(0.99, sum by (le, endpoint) (rate(stampguard_admission_evaluation_seconds_bucket[$__rate_interval])))`, "p99 {{endpoint}}"))
	bd.add(bd.promSeries("Evaluation errors", "Reviews per second that could not be evaluated, by endpoint and reason.", units.RequestsPerSecond, 6, 8,
		`sum by (endpoint, reason) (rate(stampguard_admission_errors_total[$__rate_interval]))`, "{{endpoint}} {{reason}}"))
	bd.add(bd.promSeries("Policies", "The ConcurrencyPolicies the webhook knows, by state.", units.Short, 6, 8,
		`sum by (state) (stampguard_policies)`, "{{state}}"))
	bd.row("Audit sink")
	bd.add(bd.promSeries("Events accepted and stored", "Events per second accepted by source, stored into ClickHouse, and dropped as already stored.", units.OpsPerSecond, 12, 8,
		`sum by (source) (rate(auditsink_events_accepted_total[$__rate_interval]))`, "accepted {{source}}",
		`sum(rate(auditsink_events_stored_total[$__rate_interval]))`, "stored",
		`sum(rate(auditsink_events_deduplicated_total[$__rate_interval]))`, "deduplicated"))
	bd.add(bd.promSeries("Refused and dead-lettered", "Webhook batches refused per second (answered non-2xx, by reason) and inputs stored as dead letters per second (by source).", units.OpsPerSecond, 12, 8,
		`sum by (reason) (rate(auditsink_batches_refused_total[$__rate_interval]))`, "refused batches {{reason}}",
		`sum by (source) (rate(auditsink_events_dead_lettered_total[$__rate_interval]))`, "dead-lettered {{source}}"))
	bd.add(bd.promSeries("Insert lag", fmt.Sprintf("Age of the oldest spool record not yet confirmed stored in ClickHouse; the alert fires above %s.", duration(g.o.Alerts.InsertLag)), units.Seconds, 8, 8,
		`max(auditsink_spool_oldest_unconfirmed_seconds)`, "insert lag").
		Thresholds(thresholds(nil, "transparent", g.o.Alerts.InsertLag.Seconds(), "red")).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine)))
	bd.add(bd.promSeries("Spool bytes", "Bytes of spool segments on disk, per sink.", units.BytesIEC, 8, 8,
		`auditsink_spool_bytes`, "{{instance}}"))
	bd.add(bd.promSeries("ClickHouse inserts", "Insert (flush) duration, p99.", units.Seconds, 4, 8,
		`histogram_quantile(0.99, sum by (le) (rate(auditsink_flush_duration_seconds_bucket[$__rate_interval])))`, "flush p99"))
	bd.add(bd.promSeries("ClickHouse errors", "Failed ClickHouse operations per second, by operation.", units.OpsPerSecond, 4, 8,
		`sum by (op) (rate(auditsink_clickhouse_errors_total[$__rate_interval]))`, "{{op}}"))
	return bd
}
