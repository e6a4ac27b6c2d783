package e2e

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/dashboards"
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
