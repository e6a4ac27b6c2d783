package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store/enginetest"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
	"github.com/stampguard/stampguard/internal/kubetest"
	"github.com/stampguard/stampguard/internal/testenv"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	wl "github.com/stampguard/stampguard/test/workload"
)

// result is one query's answer: its columns, their ClickHouse types, and
// its rows.
type result struct {
	cols  []string
	types []string
	rows  [][]any
}

func run(t *testing.T, conn driver.Conn, name, sql string) result {
	t.Helper()
	rows, err := conn.Query(t.Context(), sql)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, sql)
	}
	defer rows.Close()
	var r result
	r.cols = rows.Columns()
	for _, ct := range rows.ColumnTypes() {
		r.types = append(r.types, ct.DatabaseTypeName())
	}
	for rows.Next() {
		dst := make([]any, len(r.cols))
		for i, ct := range rows.ColumnTypes() {
			dst[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dst...); err != nil {
			t.Fatalf("%s: scan: %v", name, err)
		}
		row := make([]any, len(dst))
		for i, d := range dst {
			row[i] = reflect.ValueOf(d).Elem().Interface()
		}
		r.rows = append(r.rows, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// col is column c of every row, as text.
func (r result) col(c string) []string {
	i := slices.Index(r.cols, c)
	var out []string
	for _, row := range r.rows {
		if i < 0 {
			out = append(out, "<no column "+c+">")
			continue
		}
		if tm, ok := row[i].(time.Time); ok {
			row[i] = tm.UTC()
		}
		out = append(out, fmt.Sprint(row[i]))
	}
	return out
}

// sum adds column c over the rows.
func (r result) sum(c string) uint64 {
	var n uint64
	for _, v := range r.col(c) {
		var x uint64
		if _, err := fmt.Sscan(v, &x); err != nil {
			return math.MaxUint64 // not a count: no expectation matches
		}
		n += x
	}
	return n
}

// counted is the count behind a per-second series' column c: its values
// times the buckets' seconds, summed over the rows, to the nearest integer.
func (r result) counted(c string, interval time.Duration) uint64 {
	var sum float64
	for _, v := range r.col(c) {
		var x float64
		if _, err := fmt.Sscan(v, &x); err != nil {
			return math.MaxUint64 // not a number: no expectation matches
		}
		sum += x * interval.Seconds()
	}
	return uint64(math.Round(sum))
}

// seriesInterval is the panel interval the proofs expand the series for.
const seriesInterval = 10 * time.Second

// table is the rows as text lines of the given columns, in order.
func (r result) table(cols ...string) []string {
	var out []string
	for i := range r.rows {
		var cells []string
		for _, c := range cols {
			cells = append(cells, r.col(c)[i])
		}
		out = append(out, strings.Join(cells, " | "))
	}
	return out
}

// TestDashboardQueriesOnClickHouse is the proof of the generated files:
// the workload runs against a real apiserver, `auditsink ingest` loads its
// audit log into a real ClickHouse, and every panel's, variable's and
// alert rule's query, expanded as Grafana and the ClickHouse plugin expand
// it, runs there for single values, several values and "All" of the
// variables, and returns the columns its panel needs. Their numbers equal
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
	logCopy := t.TempDir() + "/audit.log"
	if b, err := os.ReadFile(env.AuditLogPath); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(logCopy, b, 0o600); err != nil {
		t.Fatal(err)
	}
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
	for _, w := range windows {
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
			for _, sel := range selections {
				answers[sel.name] = map[string]result{}
				sqls := expand(sel.vars, sel.all, seriesInterval)
				for _, q := range gen.Queries {
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

// panelsMatch requires the answers of the unfiltered panels (got, by query
// name) to equal want, the report of the same window, section by section,
// and the series and breakdowns to add up to its totals. It returns the
// audited stampless writes that the alert on them must count.
func panelsMatch(t *testing.T, gen *dashboards.Generated, got map[string]result, want report.Report) (audited uint64) {
	t.Helper()
	byStatement := func(s asql.Statement) []result {
		var rs []result
		for _, q := range gen.Queries {
			if q.Statement.Name == s.Name && !q.Alert {
				rs = append(rs, got[q.Name])
			}
		}
		if len(rs) == 0 {
			t.Fatalf("no panel reads %s", s.Name)
		}
		return rs
	}
	tot := want.Totals
	for _, r := range byStatement(asql.Totals) {
		gotTotals := r.table(asql.Totals.Columns...)
		wantTotals := []string{fmt.Sprintf("%d | %d | %d | %d | %d | %d | %d | %d | %d | %v", tot.Requests, tot.WriteAttempts, tot.VersionConflicts,
			tot.FieldConflicts, tot.AlreadyExists, tot.DeletePreconditionConflicts, tot.StamplessUpdates, tot.OtherConflicts, tot.Gone, tot.ConflictRate)}
		assertEqual(t, "totals", gotTotals, wantTotals)
	}
	rate := func(c, a uint64) string {
		if a == 0 {
			return "0"
		}
		return fmt.Sprint(float64(c) / float64(a))
	}
	var users, resources, hot, loopsOpen, loopsDone, stampless, leases, decisions []string
	for _, u := range want.ConflictsByUser {
		users = append(users, fmt.Sprintf("%s | %d | %d | %s", u.User, u.WriteAttempts, u.VersionConflicts, rate(u.VersionConflicts, u.WriteAttempts)))
	}
	for _, c := range want.ConflictsByResource {
		resources = append(resources, fmt.Sprintf("%s | %s | %d | %d | %s", c.APIGroup, c.Resource, c.WriteAttempts, c.VersionConflicts, rate(c.VersionConflicts, c.WriteAttempts)))
	}
	for _, h := range want.HotObjects {
		hot = append(hot, fmt.Sprintf("%s | %s | %s | %s | %d | %d | %d | %s", h.APIGroup, h.Resource, h.Namespace, h.Name, h.WriteAttempts, h.DistinctWriters, h.VersionConflicts, rate(h.VersionConflicts, h.WriteAttempts)))
	}
	seconds := func(ts string) string {
		tm, err := time.Parse(report.TimeFormat, ts)
		if err != nil {
			t.Fatal(err)
		}
		return tm.Truncate(time.Second).UTC().Format("2006-01-02 15:04:05 +0000 UTC")
	}
	for _, l := range want.RetryLoops {
		line := fmt.Sprintf("%s | %s | %s | %s | %s | %d | %s | %s", l.User, l.APIGroup, l.Resource, l.Namespace, l.Name, l.Conflicts, seconds(l.First), seconds(l.Last))
		if l.Resolved {
			loopsDone = append(loopsDone, line)
		} else {
			loopsOpen = append(loopsOpen, line)
		}
	}
	for _, s := range want.StamplessUpdates {
		stampless = append(stampless, fmt.Sprintf("%s | %s | %s | %s | %s | %d", s.User, s.APIGroup, s.Resource, s.Namespace, s.Name, s.Count))
	}
	for _, l := range want.LeaseHolderChanges {
		leases = append(leases, fmt.Sprintf("%s | %s | %d | %v", l.Namespace, l.Name, l.Changes, l.Holders))
	}
	for _, p := range want.PolicyDecisions {
		decisions = append(decisions, fmt.Sprintf("%s | %s | %s | %d", p.Policy, p.Kind, p.Action, p.Count))
		if p.Kind == "stamp-missing" && p.Action == "audit" {
			audited += p.Count
		}
	}
	if len(want.RetryLoops) == 0 || len(want.LeaseHolderChanges) == 0 || len(want.StamplessUpdates) == 0 {
		t.Fatalf("the workload left no retry loop, lease change or stampless update to compare: %+v", want)
	}
	lines := func(s asql.Statement, cols ...string) []string { return byStatement(s)[0].table(cols...) }
	assertEqual(t, "conflicts by writer", lines(asql.ConflictsByUser, asql.ConflictsByUser.Columns...), users)
	assertEqual(t, "conflicts by resource", lines(asql.ConflictsByResource, asql.ConflictsByResource.Columns...), resources)
	assertEqual(t, "hot objects", lines(asql.HotObjects, asql.HotObjects.Columns...), hot)
	assertEqual(t, "unresolved retry loops", sorted(lines(asql.UnresolvedRetryLoops, asql.UnresolvedRetryLoops.Columns...)), sorted(loopsOpen))
	assertEqual(t, "resolved retry loops", sorted(lines(asql.ResolvedRetryLoops, asql.ResolvedRetryLoops.Columns...)), sorted(loopsDone))
	assertEqual(t, "stampless updates", lines(asql.StamplessUpdates, asql.StamplessUpdates.Columns...), stampless)
	assertEqual(t, "lease holder changes", lines(asql.LeaseHolderChanges, asql.LeaseHolderChanges.Columns...), leases)
	assertEqual(t, "policy decisions", lines(asql.PolicyDecisions, asql.PolicyDecisions.Columns...), decisions)

	// Series and breakdowns add up to the totals.
	kinds := byStatement(asql.ConflictKindsSeries)[0]
	sums := map[string]uint64{"version": tot.VersionConflicts, "field": tot.FieldConflicts, "delete_precondition": tot.DeletePreconditionConflicts,
		"already_exists": tot.AlreadyExists, "other": tot.OtherConflicts}
	for c, n := range sums {
		if kinds.counted(c, seriesInterval) != n {
			t.Errorf("conflict kinds: %s sums to %d, the report counts %d", c, kinds.counted(c, seriesInterval), n)
		}
	}
	sg := byStatement(asql.StamplessGoneSeries)[0]
	if sg.counted("stampless_updates", seriesInterval) != tot.StamplessUpdates || sg.counted("gone", seriesInterval) != tot.Gone {
		t.Errorf("stampless/gone series sum to %d/%d, the report counts %d/%d", sg.counted("stampless_updates", seriesInterval), sg.counted("gone", seriesInterval), tot.StamplessUpdates, tot.Gone)
	}
	var writeConflicts uint64
	for _, u := range want.ConflictsByUser {
		writeConflicts += u.VersionConflicts
	}
	for _, s := range []asql.Statement{asql.ConflictsByNamespace, asql.ConflictsByUserAgent} {
		r := byStatement(s)[0]
		if r.sum("attempts") != tot.WriteAttempts || r.sum("conflicts") != writeConflicts {
			t.Errorf("%s: %d attempts and %d conflicts, the report counts %d and %d", s.Name, r.sum("attempts"), r.sum("conflicts"), tot.WriteAttempts, writeConflicts)
		}
	}
	if n := byStatement(asql.StamplessByWriter)[0].sum("count"); n != tot.StamplessUpdates {
		t.Errorf("stampless by writer sums to %d, the report counts %d", n, tot.StamplessUpdates)
	}
	var leaseConflicts uint64
	for _, c := range want.ConflictsByResource {
		if c.APIGroup == "coordination.k8s.io" && c.Resource == "leases" {
			leaseConflicts = c.VersionConflicts
		}
	}
	if n := byStatement(asql.LeaseConflicts)[0].sum("conflicts"); n != leaseConflicts {
		t.Errorf("lease conflicts sum to %d, the report counts %d on leases", n, leaseConflicts)
	}
	var decided uint64
	for _, p := range want.PolicyDecisions {
		decided += p.Count
	}
	if n := byStatement(asql.PolicyDecisionsSeries)[0].counted("count", seriesInterval); n != decided {
		t.Errorf("decisions series sums to %d, the report counts %d", n, decided)
	}
	if n := byStatement(asql.GoneByWriter)[0].sum("count"); n != tot.Gone {
		t.Errorf("410 Gone by writer sums to %d, the report counts %d", n, tot.Gone)
	}
	var leaseChanges uint64
	for _, l := range want.LeaseHolderChanges {
		leaseChanges += l.Changes
	}
	if n := byStatement(asql.LeaseChangesSeries)[0].counted("changes", seriesInterval); n != leaseChanges {
		t.Errorf("lease changes series sums to %d, the report counts %d", n, leaseChanges)
	}
	if n := uint64(len(byStatement(asql.RawEvents)[0].rows)); n != min(tot.Requests, 500) {
		t.Errorf("the audit events table has %d rows, the report counts %d requests (the table shows at most 500)", n, tot.Requests)
	}
	return audited
}

// checkShape requires the columns a query's panel or rule needs.
func checkShape(t *testing.T, q dashboards.Query, r result) {
	t.Helper()
	switch {
	case q.Statement.Name == "":
		if len(r.cols) != 1 {
			t.Errorf("%s: a variable's query returns %v, want one column", q.Name, r.cols)
		}
	case q.Shape == asql.Series:
		if !slices.Equal(r.cols, q.Statement.Columns) || r.types[0] != "DateTime" {
			t.Errorf("%s: columns %v %v, want %v with a DateTime time first", q.Name, r.cols, r.types, q.Statement.Columns)
		}
	case q.Shape == asql.Number:
		if len(r.cols) != 1 || len(r.rows) != 1 {
			t.Errorf("%s: %d columns and %d rows, want one number", q.Name, len(r.cols), len(r.rows))
		} else if f, ok := number(r.rows[0][0]); !ok || math.IsNaN(f) {
			t.Errorf("%s: %v is not a number", q.Name, r.rows[0][0])
		}
	default:
		if !slices.Equal(r.cols, q.Statement.Columns) {
			t.Errorf("%s: columns %v, want %v", q.Name, r.cols, q.Statement.Columns)
		}
	}
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

func sorted(xs []string) []string {
	xs = slices.Clone(xs)
	sort.Strings(xs)
	return xs
}

func assertEqual(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s differs from the report\ngot  %q\nwant %q", what, got, want)
	}
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
	logCopy := t.TempDir() + "/audit.log"
	if b, err := os.ReadFile(env.AuditLogPath); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(logCopy, b, 0o600); err != nil {
		t.Fatal(err)
	}
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
