package report

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// rowsOf runs sql and returns every row as text, sorted, with the column names.
func rowsOf(t *testing.T, ctx context.Context, conn driver.Conn, sql string, args ...any) ([]string, []string) {
	t.Helper()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		dst := make([]any, len(rows.ColumnTypes()))
		for i, ct := range rows.ColumnTypes() {
			dst[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dst...); err != nil {
			t.Fatal(err)
		}
		var cells []string
		for _, d := range dst {
			cells = append(cells, fmt.Sprint(reflect.ValueOf(d).Elem().Interface()))
		}
		out = append(out, strings.Join(cells, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return rows.Columns(), out
}

// panelVariables are the dashboards' template variables of the filters:
// cluster and name hold one value, the others several or "All".
var panelVariables = map[string]asql.Variable{"cluster": {Name: "cluster"}, "namespace": {Name: "namespace", Multi: true},
	"resource": {Name: "resource", Multi: true}, "user": {Name: "user", Multi: true}, "name": {Name: "name"}}

// TestGrafanaBinderEqualsReportBinder renders every statement with both
// binders and requires the same rows: the report's split window and bound
// parameters against the plugin's macros (expanded as the plugin does) and
// template variables, over windows with whole-second edges that cut hours,
// with no hour compacted, the first two, and all of them (so the Grafana
// forms read both the hour caches and raw events, and find the clean hours
// themselves).
func TestGrafanaBinderEqualsReportBinder(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	conn := store.Conn()
	if err := Synthesize(ctx, conn, db, "bench", 60_000, 5, t0, 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	// The writer and object name of the most conflicted pair, for the
	// single-value filters.
	var hotWriter, hotName string
	if err := conn.QueryRow(ctx, "SELECT writer, name FROM "+db+".events_by_hour WHERE "+asql.VersionConflict+" GROUP BY writer, name ORDER BY count() DESC, writer, name LIMIT 1").Scan(&hotWriter, &hotName); err != nil {
		t.Fatal(err)
	}
	values := map[string]string{"top": "1000", "gap_us": "300000000", "threshold": "5", "min_handoffs": "3", "min_writes": "10", "stale_us": "600000000", "storm_s": "600", "storm_rate": "0.2", "min_bucket_writes": "3", "verb": "''", "code": "''", "hide_system": "'no'"}
	extra := []any{clickhouse.Named("interval_s", uint64(600)), clickhouse.Named("min_writes", uint64(10)), clickhouse.Named("stale_us", uint64(600_000_000)),
		clickhouse.Named("storm_s", uint64(600)), clickhouse.Named("storm_rate", 0.2), clickhouse.Named("min_bucket_writes", uint64(3))}
	type filter struct {
		vars  map[string][]string
		all   map[string]bool
		names map[string]string
	}
	filters := []filter{
		{vars: map[string][]string{"cluster": {"bench"}, "name": {""}}, all: map[string]bool{"namespace": true, "resource": true, "user": true}},
		{vars: map[string][]string{"cluster": {"bench"}, "resource": {"configmaps"}, "name": {""}}, all: map[string]bool{"namespace": true, "user": true},
			names: map[string]string{"resource": "configmaps"}},
		{vars: map[string][]string{"cluster": {"bench"}, "user": {hotWriter}, "name": {hotName}}, all: map[string]bool{"namespace": true, "resource": true},
			names: map[string]string{"user": hotWriter, "name": hotName}},
	}
	windows := [][2]time.Duration{
		{-time.Hour, 5 * time.Hour},
		{17*time.Minute + 3*time.Second, 3*time.Hour + 41*time.Minute + 9*time.Second},
		{61 * time.Minute, 119 * time.Minute},
	}
	// Every epoch meets every window and every filter, and every window
	// every filter, once each: a Latin square, not the whole cube.
	checked := 0
	history := newHistoryRotation(len(windows))
	epochs := []string{"no hour compacted", "two hours compacted", "every hour compacted"}
	for ei, epoch := range epochs {
		switch epoch {
		case "two hours compacted":
			for _, h := range []time.Time{t0, t0.Add(time.Hour)} {
				if err := store.CompactHour(ctx, h); err != nil {
					t.Fatal(err)
				}
			}
		case "every hour compacted":
			compact(t, store)
		}
		for wi, w := range windows {
			f := filters[(ei+wi)%len(filters)]
			o := Options{Database: db, Cluster: "bench", Top: 1000, Since: t0.Add(w[0]), Until: t0.Add(w[1])}
			o.Resource, o.User = f.names["resource"], f.names["user"]
			o.setDefaults()
			if err := o.split(ctx, conn); err != nil {
				t.Fatal(err)
			}
			q := o.querier(ctx, conn)
			if f.names["name"] != "" { // the report has no name filter: narrow its binder by hand
				for i, a := range q.args {
					if a.(driver.NamedValue).Name == asql.Name.Name {
						q.args[i] = clickhouse.Named(asql.Name.Name, f.names["name"])
					}
				}
				q.binder.Narrowed = append(q.binder.Narrowed, asql.Name)
			}
			e := asql.Expansion{From: o.Since, To: o.Until.Add(-time.Second), Interval: 10 * time.Minute, Vars: f.vars, All: f.all}
			g := asql.Grafana{Database: db, Variables: panelVariables, Values: values}
			for _, s := range asql.All {
				if !history.runs(s, ei, wi) {
					continue
				}
				_, want := rowsOf(t, ctx, conn, q.binder.Bind(s), append(q.args, extra...)...)
				bound, err := g.Bind(s)
				if err != nil {
					t.Fatal(err)
				}
				sql, err := e.Expand(bound)
				if err != nil {
					t.Fatal(err)
				}
				cols, got := rowsOf(t, ctx, conn, sql)
				if !slices.Equal(cols, s.Columns) {
					t.Errorf("%s: columns %v, declared %v", s.Name, cols, s.Columns)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s, window %v filters %v: %s differs\nreport  %d rows %.300v\ngrafana %d rows %.300v", epoch, w, f.names, s.Name, len(want), want, len(got), got)
				}
				if len(want) > 0 {
					checked++
				}
			}
		}
	}
	if checked < len(asql.All)*4 {
		t.Errorf("only %d comparisons had rows", checked)
	}
	history.covered(t, len(epochs))
}

// rotation spreads the statements it rotates over a test's combinations
// of an epoch (what is compacted) and a window: each runs once per
// epoch, in turn over the n windows, so every window of every epoch
// still meets some of them. The statements that read the field history
// in segments rotate in every test (newHistoryRotation): they read one source, and
// 18.16 spends about 0.5 s analysing each panel form of it.
type rotation struct {
	n     int
	names []string                // the statements it rotates, in asql.All's order
	seen  map[string]map[int]bool // statement name: the epochs it ran in
}

// newRotation rotates the statements of asql.All that rotates selects;
// the others run in every combination.
func newRotation(n int, rotates func(asql.Statement) bool) *rotation {
	h := &rotation{n: n, seen: map[string]map[int]bool{}}
	for _, s := range asql.All {
		if rotates(s) {
			h.names = append(h.names, s.Name)
			h.seen[s.Name] = map[int]bool{}
		}
	}
	return h
}

// newHistoryRotation rotates the statements that read the field history
// in segments (the field changes, the no-op writes, the conflicts'
// blockers).
func newHistoryRotation(n int) *rotation { return newRotation(n, asql.Statement.ReadsSegments) }

// runs says whether s runs in epoch e and window w.
func (h *rotation) runs(s asql.Statement, e, w int) bool {
	k := slices.Index(h.names, s.Name)
	if k < 0 {
		return true
	}
	if (k+e)%h.n != w {
		return false
	}
	h.seen[s.Name][e] = true
	return true
}

// covered requires every rotated statement to have run in each of the
// epochs.
func (h *rotation) covered(t *testing.T, epochs int) {
	t.Helper()
	if len(h.names) == 0 {
		t.Error("the rotation holds no statement")
	}
	for _, name := range h.names {
		if len(h.seen[name]) != epochs {
			t.Errorf("%s ran in %d epochs of %d", name, len(h.seen[name]), epochs)
		}
	}
}

// TestGrafanaMultiValueFiltersSumTheirValues proves the multi-value form
// of the filters: totals over two namespaces are the sums of each.
func TestGrafanaMultiValueFiltersSumTheirValues(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	conn := store.Conn()
	if err := Synthesize(ctx, conn, db, "bench", 20_000, 9, t0, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	g := asql.Grafana{Database: db, Variables: panelVariables,
		Values: map[string]string{"hide_system": "'no'"}}
	bound, err := g.Bind(asql.Totals)
	if err != nil {
		t.Fatal(err)
	}
	_, nss := rowsOf(t, ctx, conn, "SELECT DISTINCT namespace FROM "+db+".events_by_hour")
	if len(nss) < 2 {
		t.Fatalf("only %d namespaces", len(nss))
	}
	requests := func(ns ...string) uint64 {
		e := asql.Expansion{From: t0, To: t0.Add(2 * time.Hour), Interval: time.Minute,
			Vars: map[string][]string{"cluster": {"bench"}, "namespace": ns, "name": {""}}, All: map[string]bool{"resource": true, "user": true}}
		sql, err := e.Expand(bound)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT requests FROM ("+sql+")").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b, both := requests(nss[0]), requests(nss[1]), requests(nss[0], nss[1])
	if a == 0 || b == 0 || both != a+b {
		t.Errorf("namespaces %s and %s: %d + %d requests, both together %d", nss[0], nss[1], a, b, both)
	}
}
