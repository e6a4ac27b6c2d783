package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store/enginetest"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
	wl "github.com/stampguard/stampguard/test/workload"
)

// TestDashboardQueriesOnClickHouse is the proof of the generated files:
// the workload runs against a real apiserver, `auditsink ingest` loads its
// audit log into a real ClickHouse, and every panel's, variable's and
// alert rule's query, expanded as Grafana and the ClickHouse plugin expand
// it, runs there for single values, several values and "All" of the
// variables, and returns the columns its panel needs (under the filters
// in the first window; the totals in both). Their numbers equal
// `auditsink report --format json` over the same window: a window whole
// seconds around the run (raw events) and one of whole hours (the rollup).
func TestDashboardQueriesOnClickHouse(t *testing.T) {
	testenv.SkipIfShort(t, "starts kube-apiserver, etcd and clickhouse-server")
	ch := chtest.Start(t)
	gen, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, cluster := gen.Options.Database, gen.Options.Alerts.Cluster
	env := kubetest.Start(t, wl.KubetestOptions())
	ctx := t.Context()
	res, err := wl.Run(ctx, env)
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	if _, err := res.WaitAudited(ctx); err != nil {
		t.Fatal(err)
	}
	// The log is a snapshot: the apiserver keeps appending to its own.
	logCopy := snapshot(t, []string{env.AuditLogPath})[0]
	bin := buildAuditsink(t, kubetest.RepoRoot(t), t.TempDir())
	sink := auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
	sink("ingest", "--database", db, "--cluster", cluster, logCopy)
	conn := ch.Conn(t, db)

	// Whole-second edges with no event on them, around the run.
	from, to := res.Since.Truncate(time.Second).Add(-time.Second), res.Until.Truncate(time.Second).Add(time.Second)
	for range 10 {
		var n uint64
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.events_by_hour WHERE toUInt32(event_time) IN (%d, %d)", db, from.Unix(), to.Unix())).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		from, to = from.Add(-time.Second), to.Add(time.Second)
	}
	windows := []struct {
		name     string
		from, to time.Time // the dashboard's range: both ends inclusive, whole seconds
	}{
		{"seconds around the run", from, to},
		{"whole hours", res.Since.Truncate(time.Hour).Add(-time.Hour), res.Until.Truncate(time.Hour).Add(2*time.Hour - time.Second)},
	}

	var namespaces, writers []string
	for _, r := range res.Requests {
		if r.Namespace != "" && !slices.Contains(namespaces, r.Namespace) {
			namespaces = append(namespaces, r.Namespace)
		}
		if !slices.Contains(writers, r.Writer) {
			writers = append(writers, r.Writer)
		}
	}
	sort.Strings(namespaces)
	sort.Strings(writers)
	if len(namespaces) < 2 || len(writers) < 2 {
		t.Fatalf("the workload wrote in %v as %v: too few to filter by", namespaces, writers)
	}

	all := map[string]bool{"namespace": true, "resource": true, "user": true}
	allRequests := map[string]bool{"namespace": true, "resource": true, "user": true, "verb": true, "code": true}
	for wi, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			o := gen.Options
			reportOf := func(args ...string) report.Report {
				t.Helper()
				out := sink(append([]string{"report", "--database", db, "--cluster", cluster, "--format", "json",
					"--top", fmt.Sprint(o.Top), "--since", w.from.UTC().Format(time.RFC3339),
					"--until", w.to.Add(time.Second).UTC().Format(time.RFC3339)}, args...)...)
				var r report.Report
				if err := json.Unmarshal(out, &r); err != nil {
					t.Fatalf("report: %v\n%s", err, out)
				}
				return r
			}
			expand := func(vars map[string][]string, all map[string]bool, interval time.Duration) map[string]string {
				t.Helper()
				v := map[string][]string{"cluster": {cluster}, "name": {""}, "hide_system": {"no"}}
				for k, x := range vars {
					v[k] = x
				}
				// Every verb and code, as the variables' "All".
				all = maps.Clone(all)
				all["verb"], all["code"] = true, true
				sqls, err := gen.Expanded(asql.Expansion{From: w.from, To: w.to, Interval: interval, Vars: v, All: all})
				if err != nil {
					t.Fatal(err)
				}
				return sqls
			}

			selections := []struct {
				name string
				vars map[string][]string
				all  map[string]bool
			}{
				{"All", nil, all},
				{"one namespace", map[string][]string{"namespace": namespaces[:1]}, map[string]bool{"resource": true, "user": true}},
				{"two namespaces", map[string][]string{"namespace": namespaces[:2]}, map[string]bool{"resource": true, "user": true}},
				{"one writer and resource", map[string][]string{"user": writers[:1], "resource": {"configmaps"}}, map[string]bool{"namespace": true}},
			}
			answers := map[string]map[string]result{}
			for si, sel := range selections {
				answers[sel.name] = map[string]result{}
				sqls := expand(sel.vars, sel.all, seriesInterval)
				for qi, q := range gen.Queries {
					// Of a filtered selection, the checks below read the
					// totals; every query's shape under the filters is
					// the same in both windows, checked in the first.
					if sel.vars != nil && wi > 0 && q.Statement.Name != asql.Totals.Name {
						continue
					}
					// A query that reads the history in segments (the
					// slowest, 1 to 1.7 s each here) has its shape under
					// filters checked in one filtered selection, in turn.
					if sel.vars != nil && q.Statement.ReadsSegments() && qi%(len(selections)-1) != si-1 {
						continue
					}
					r := run(t, conn, q.Name, sqls[q.Name])
					answers[sel.name][q.Name] = r
					checkShape(t, q, r)
				}
			}

			// The numbers of the unfiltered panels are the report's.
			want := reportOf()
			if want.Totals.Requests == 0 || want.Totals.VersionConflicts == 0 {
				t.Fatalf("the report over the window is empty: %+v", want.Totals)
			}
			got := answers["All"]
			t.Logf("%d queries x %d selections; report totals %+v, %d retry loops, %d lease changes", len(gen.Queries), len(selections), want.Totals, len(want.RetryLoops), len(want.LeaseHolderChanges))
			audited := panelsMatch(t, gen, got, want)
			tot := want.Totals
			// One bucket holds the whole window: its rate is the report's.
			oneBucket := expand(nil, all, 1_000_000_000*time.Second)
			for _, q := range gen.Queries {
				if q.Statement.Name == asql.ConflictRateSeries.Name {
					r := run(t, conn, q.Name, oneBucket[q.Name])
					assertEqual(t, q.Name+" in one bucket", r.col("conflict_rate"), []string{fmt.Sprint(tot.ConflictRate)})
				}
			}

			// The alert queries.
			wantRate := 0.0
			if tot.WriteAttempts >= uint64(o.Alerts.MinWrites) {
				wantRate = tot.ConflictRate
			}
			// The stale loops: per writer and object, the conflicts of
			// its unresolved loops that ended LoopStale before the end.
			staleConflicts := map[string]uint64{}
			until := w.to.Add(time.Second)
			for _, l := range want.RetryLoops {
				last, _ := time.Parse(report.TimeFormat, l.Last)
				if !l.Resolved && last.Add(o.Alerts.LoopStale).Before(until) {
					object := l.Resource
					if l.APIGroup != "" {
						object += "." + l.APIGroup
					}
					staleConflicts[l.User+" | "+l.Namespace+" | "+object+"/"+l.Name] += l.Conflicts
				}
			}
			var stale []string
			for k, n := range staleConflicts {
				stale = append(stale, fmt.Sprintf("%s | %d", k, n))
			}
			for _, q := range gen.Queries {
				if !q.Alert {
					continue
				}
				r := got[q.Name]
				var want string
				switch q.Statement.Name {
				case asql.ConflictRate.Name:
					want = fmt.Sprint(wantRate)
				case asql.StaleRetryLoops.Name:
					assertEqual(t, q.Name, sorted(r.table(asql.StaleRetryLoops.Columns...)), sorted(stale))
					continue
				case asql.WriteAttempts.Name:
					want = fmt.Sprint(tot.WriteAttempts)
				case asql.AuditedStamplessWrites.Name:
					want = fmt.Sprint(audited)
				case asql.LostUpdateCount.Name:
					// The report's lost updates over the window, all of them.
					want = fmt.Sprint(len(reportOf("--history", "--top", "1000000").LostUpdates))
				default:
					t.Errorf("%s: no expectation for %s", q.Name, q.Statement.Name)
					continue
				}
				assertEqual(t, q.Name, r.col(r.cols[0]), []string{want})
			}

			// The variables list what was ingested.
			for _, q := range gen.Queries {
				if strings.HasSuffix(q.Name, "/var/cluster") && !slices.Contains(got[q.Name].col("cluster"), cluster) {
					t.Errorf("%s lists %v, not %s", q.Name, got[q.Name].col("cluster"), cluster)
				}
				if strings.HasSuffix(q.Name, "/var/namespace") {
					assertEqual(t, q.Name, got[q.Name].col("namespace"), namespaces)
				}
			}

			// Filters: one value equals the report's filter; two values
			// are the sums of each.
			oneNS := reportOf("--namespace", namespaces[0]).Totals
			writer := reportOf("--user", writers[0], "--resource", "configmaps").Totals
			for _, q := range gen.Queries {
				if q.Statement.Name != asql.Totals.Name || q.Alert {
					continue
				}
				one, two := answers["one namespace"][q.Name], answers["two namespaces"][q.Name]
				assertEqual(t, q.Name+" for one namespace", one.col("requests"), []string{fmt.Sprint(oneNS.Requests)})
				other := reportOf("--namespace", namespaces[1]).Totals
				assertEqual(t, q.Name+" for two namespaces", two.col("requests"), []string{fmt.Sprint(oneNS.Requests + other.Requests)})
				assertEqual(t, q.Name+" for one writer and resource", answers["one writer and resource"][q.Name].table("requests", "write_attempts", "version_conflicts"),
					[]string{fmt.Sprintf("%d | %d | %d", writer.Requests, writer.WriteAttempts, writer.VersionConflicts)})
				break
			}
			// The object filter (the name text box with its namespace and
			// resource, as the hot objects' data link sets them) gives that
			// object's row of the report.
			h := want.HotObjects[0]
			object := expand(map[string][]string{"namespace": {h.Namespace}, "resource": {h.Resource}, "name": {h.Name}}, map[string]bool{"user": true}, 10*time.Second)
			for _, q := range gen.Queries {
				if q.Statement.Name == asql.Totals.Name && !q.Alert {
					r := run(t, conn, q.Name, object[q.Name])
					assertEqual(t, q.Name+" for the hottest object", r.table("write_attempts", "version_conflicts"),
						[]string{fmt.Sprintf("%d | %d", h.WriteAttempts, h.VersionConflicts)})
					break
				}
			}
			if oneNS.Requests == 0 || oneNS.Requests == tot.Requests {
				t.Errorf("namespace %s holds %d of %d requests: the filter is not exercised", namespaces[0], oneNS.Requests, tot.Requests)
			}
		})
	}

	// The same panel SQL on ClickHouse 26.7 (chDB) over the same events
	// gives the same answers, for both windows.
	t.Run("26.7 answers as 18.16 does", func(t *testing.T) {
		en := enginetest.Attach(t, ch, chdbtest.Open(t), db)
		en.CopyTo26(t)
		var stmts []enginetest.Statement
		for _, w := range windows {
			sqls, err := gen.Expanded(asql.Expansion{From: w.from, To: w.to, Interval: 10 * time.Second,
				Vars: map[string][]string{"cluster": {cluster}, "name": {""}, "hide_system": {"no"}}, All: allRequests})
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range gen.Queries {
				st := enginetest.Statement{Name: w.name + ": " + q.Name, SQL: sqls[q.Name]}
				if q.Statement.Name == asql.UnresolvedRetryLoops.Name || q.Statement.Name == asql.ResolvedRetryLoops.Name {
					st.Norm = enginetest.Unordered // a filter over the ordered loops; the table sorts itself
				}
				stmts = append(stmts, st)
			}
		}
		if rows := en.SameAnswers(t, "", stmts); rows == 0 {
			t.Error("every panel answered nothing")
		} else {
			t.Logf("%d statements, %d rows, the same on both engines", len(stmts), rows)
		}
	})
}

// TestPolicyPanelsOnClickHouse proves the policy enforcement panels and the
// stampless-writes-under-Audit rule on real stampguard decisions: the
// webhook runs against a real apiserver with one policy in Audit mode and
// one in Deny mode, alice writes without a stamp under both, `auditsink
// ingest` loads the audit log, and the panels' numbers equal `auditsink
// report`'s (and what alice did).
func TestPolicyPanelsOnClickHouse(t *testing.T) {
	testenv.SkipIfShort(t, "starts kube-apiserver, etcd, the webhook and clickhouse-server")
	ch := chtest.Start(t)
	gen, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, cluster := gen.Options.Database, gen.Options.Alerts.Cluster
	env := startWebhookEnv(t)
	admin, alice := env.Client, env.ClientAs(t, "alice")
	ctx := t.Context()
	start := time.Now()
	const audited, denied = 3, 2
	for _, p := range []struct {
		ns     string
		action v1alpha1.Action
	}{{"dash-audit", v1alpha1.ActionAudit}, {"dash-deny", v1alpha1.ActionDeny}} {
		namespace(t, admin, p.ns, nil)
		applyPolicy(t, admin, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: p.ns},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{p.ns}},
				RequireResourceVersion: true,
				Action:                 p.action,
			},
		}, metav1.ConditionTrue)
		create(t, alice, configMap(p.ns, "settings", nil))
	}
	for i := range audited {
		blind := configMap("dash-audit", "settings", nil)
		blind.Data["k"] = fmt.Sprint(i)
		if err := alice.Update(ctx, blind); err != nil {
			t.Fatalf("a stampless update under Audit was refused: %v", err)
		}
	}
	for range denied {
		if err := alice.Update(ctx, configMap("dash-deny", "settings", nil)); !apierrors.IsInvalid(err) {
			t.Fatalf("a stampless update under Deny: %v, want 422", err)
		}
	}
	end := time.Now()
	eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(env.AuditLogPath)
		if err != nil {
			return err
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"stage":"ResponseComplete"`) && strings.Contains(line, "stamp.stampguard.dev/stamp-missing") {
				n++
			}
		}
		if n < audited+denied {
			return fmt.Errorf("%d audited decisions in the log, want %d", n, audited+denied)
		}
		return nil
	})
	logCopy := snapshot(t, []string{env.AuditLogPath})[0]
	bin := buildAuditsink(t, kubetest.RepoRoot(t), t.TempDir())
	sink := auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
	sink("ingest", "--database", db, "--cluster", cluster, logCopy)
	conn := ch.Conn(t, db)

	from, to := start.Truncate(time.Second).Add(-time.Second), end.Truncate(time.Second).Add(time.Second)
	out := sink("report", "--database", db, "--cluster", cluster, "--format", "json", "--top", fmt.Sprint(gen.Options.Top),
		"--since", from.UTC().Format(time.RFC3339), "--until", to.Add(time.Second).UTC().Format(time.RFC3339))
	var want report.Report
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	var decisions []string
	var total, auditedStamps uint64
	for _, p := range want.PolicyDecisions {
		decisions = append(decisions, fmt.Sprintf("%s | %s | %s | %d", p.Policy, p.Kind, p.Action, p.Count))
		total += p.Count
		if p.Kind == "stamp-missing" && p.Action == "audit" {
			auditedStamps += p.Count
		}
	}
	t.Logf("report policy decisions: %v", decisions)
	if !slices.Contains(decisions, fmt.Sprintf("dash-deny | stamp-missing | deny | %d", denied)) || want.Totals.StamplessUpdates != audited {
		t.Fatalf("the report counts decisions %v and %d stampless updates; alice made %d denied and %d audited", decisions, want.Totals.StamplessUpdates, denied, audited)
	}
	if auditedStamps != audited {
		t.Fatalf("the report counts %d stampless writes under Audit, alice made %d: %+v", auditedStamps, audited, want.PolicyDecisions)
	}
	sqls, err := gen.Expanded(asql.Expansion{From: from, To: to, Interval: time.Second,
		Vars: map[string][]string{"cluster": {cluster}, "name": {""}, "hide_system": {"no"}}, All: map[string]bool{"namespace": true, "resource": true, "user": true, "verb": true, "code": true}})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, q := range gen.Queries {
		r := run(t, conn, q.Name, sqls[q.Name])
		checkShape(t, q, r)
		switch q.Statement.Name {
		case asql.PolicyDecisions.Name:
			assertEqual(t, q.Name, r.table(asql.PolicyDecisions.Columns...), decisions)
		case asql.PolicyDecisionsSeries.Name:
			if r.counted("count", time.Second) != total {
				t.Errorf("%s sums to %d, the report counts %d", q.Name, r.counted("count", time.Second), total)
			}
		case asql.AuditedStamplessWrites.Name:
			assertEqual(t, q.Name, r.col("writes"), []string{fmt.Sprint(audited)})
		case asql.StamplessByWriter.Name:
			assertEqual(t, q.Name, r.table("user", "count"), []string{fmt.Sprintf("alice | %d", want.Totals.StamplessUpdates)})
		default:
			continue
		}
		checked++
	}
	if checked < 4 {
		t.Errorf("checked %d policy queries", checked)
	}
	t.Run("26.7 answers as 18.16 does", func(t *testing.T) {
		en := enginetest.Attach(t, ch, chdbtest.Open(t), db)
		en.CopyTo26(t)
		var stmts []enginetest.Statement
		for _, q := range gen.Queries {
			switch q.Statement.Name {
			case asql.PolicyDecisions.Name, asql.PolicyDecisionsSeries.Name, asql.AuditedStamplessWrites.Name, asql.StamplessByWriter.Name:
				stmts = append(stmts, enginetest.Statement{Name: q.Name, SQL: sqls[q.Name]})
			}
		}
		if rows := en.SameAnswers(t, "", stmts); rows == 0 {
			t.Error("every policy panel answered nothing")
		}
	})
}
