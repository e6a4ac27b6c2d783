package report

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/chtest"
)

// TestReportCountsDuplicatesOnce stores the same rows into two databases:
// once by a single writer, and once with a third of the events stored
// again by a plain INSERT (as a racing writer would: every view counts
// the copies) and a ninth a third time. The copies are found half by a
// replay's lookup and half by the scan. Over windows that cut hours, with
// and without filters, on the rollup path and raw, the report of the
// second database must equal the single writer's.
func TestReportCountsDuplicatesOnce(t *testing.T) {
	srv := chtest.Start(t)
	ctx := t.Context()
	rows := append(buildScenario().rows, randomRows(11, 6000)...)
	rand.New(rand.NewPCG(12, 13)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	open := func() (*analytics.Store, string) {
		st, db := migratedOn(t, srv)
		for i := 0; i < len(rows); i += 700 {
			if _, err := st.Insert(ctx, rows[i:min(i+700, len(rows))], nil); err != nil {
				t.Fatal(err)
			}
		}
		return st, db
	}
	once, onceDB := open()
	twice, twiceDB := open()
	conn := twice.Conn()
	for _, mod := range []int{3, 9} {
		q := "INSERT INTO " + twiceDB + ".events (" + analytics.EventColumns + ") SELECT " + analytics.EventColumns +
			" FROM " + twiceDB + ".events WHERE cityHash64(audit_id) % ? = 0 LIMIT 1 BY cluster, audit_id, stage, fingerprint"
		if err := conn.Exec(ctx, q, mod); err != nil {
			t.Fatal(err)
		}
	}
	var before, after uint64
	sum := func(db string) uint64 {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT toUInt64(sum(requests)) FROM "+db+".request_rollup").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before, after = sum(onceDB), sum(twiceDB)
	if after <= before {
		t.Fatalf("the copies did not reach the rollup (%d requests, single writer %d): the test proves nothing", after, before)
	}
	res, err := twice.Insert(ctx, rows[:len(rows)/2], nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored != 0 || res.Doubled == 0 {
		t.Fatalf("the replay %+v: want nothing stored and copies found", res)
	}
	if err := twice.ScanDuplicates(ctx, t0.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}

	windows := [][2]time.Time{
		{t0, t0.Add(time.Hour)},
		{t0.Add(-time.Hour), t0.Add(5 * time.Hour)},
		{t0.Add(35 * time.Second), t0.Add(3*time.Hour + 1)},
		{t0.Add(-30 * time.Minute), t0.Add(2*time.Hour + time.Microsecond)},
		{t0.Add(time.Hour - time.Microsecond), t0.Add(2*time.Hour + time.Microsecond)},
	}
	for _, w := range windows {
		for _, f := range []Options{{}, {User: "user-0"}, {Namespace: "ns-1", Resource: "deployments"}, {Namespace: "shop", Resource: "configmaps", User: "dave"}} {
			f.Cluster, f.Top, f.Since, f.Until = "c1", 1000, w[0], w[1]
			for _, noRollup := range []bool{false, true} {
				f.NoRollup = noRollup
				f.Database = onceDB
				want, wantErr := Build(ctx, once.Conn(), f)
				f.Database = twiceDB
				got, err := Build(ctx, conn, f)
				if (err != nil && !errors.Is(err, ErrNoEvents)) || !errors.Is(err, wantErr) {
					t.Fatalf("window %v filters %+v: %v (single writer: %v)", w, f, err, wantErr)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("window [%s, %s) filters %q/%q/%q raw %v: the report with duplicates differs\n got %+v\nwant %+v",
						w[0], w[1], f.Namespace, f.Resource, f.User, noRollup, got, want)
				}
			}
		}
	}

	// The dashboards' forms of every statement (always corrected: a panel
	// cannot first ask for duplicates) answer with duplicates as the
	// single writer's database does.
	vars := map[string]asql.Variable{"cluster": {Name: "cluster"}, "namespace": {Name: "namespace", Multi: true},
		"resource": {Name: "resource", Multi: true}, "user": {Name: "user", Multi: true}, "name": {Name: "name"}}
	values := map[string]string{"top": "1000", "gap_us": "300000000", "threshold": "5", "min_writes": "10", "stale_us": "600000000"}
	for _, w := range [][2]time.Duration{{0, time.Hour - time.Second}, {-time.Hour, 5*time.Hour - time.Second}, {35 * time.Second, 3 * time.Hour}} {
		e := asql.Expansion{From: t0.Add(w[0]), To: t0.Add(w[1]), Interval: 10 * time.Minute,
			Vars: map[string][]string{"cluster": {"c1"}, "name": {""}}, All: map[string]bool{"namespace": true, "resource": true, "user": true}}
		for _, st := range asql.All {
			sqlFor := func(db string) string {
				bound, err := asql.Grafana{Database: db, Variables: vars, Values: values}.Bind(st)
				if err != nil {
					t.Fatal(err)
				}
				sql, err := e.Expand(bound)
				if err != nil {
					t.Fatal(err)
				}
				return sql
			}
			_, want := rowsOf(t, ctx, conn, sqlFor(onceDB))
			_, got := rowsOf(t, ctx, conn, sqlFor(twiceDB))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("window %v: the dashboards' %s with duplicates differs\n got %.300v\nwant %.300v", w, st.Name, got, want)
			}
		}
	}
}

// TestReportCountsInstantTwinsOnce covers the one case where the report's
// cheaper match of events to their duplicates (by instant and fingerprint)
// would be wrong: two requests that share both (the same user, verb, URI,
// code and timestamps, under two audit IDs), one of them stored twice.
// Build must see the twin and match by identity; the report then equals
// the single writer's. Matching by instant anyway loses the twin (from an
// edge that adds, or from one that subtracts): the totals go wrong, which
// proves the check is what keeps them exact.
func TestReportCountsInstantTwinsOnce(t *testing.T) {
	srv := chtest.Start(t)
	ctx := t.Context()
	rows := randomRows(21, 3000)
	var doubled []string
	for i := 0; i < 3000; i += 5 {
		twin := rows[i]
		twin.AuditID += "-twin"
		rows = append(rows, twin)
		doubled = append(doubled, rows[i].AuditID)
	}
	store := func() (*analytics.Store, string) {
		st, db := migratedOn(t, srv)
		if _, err := st.Insert(ctx, rows, nil); err != nil {
			t.Fatal(err)
		}
		return st, db
	}
	once, onceDB := store()
	twice, twiceDB := store()
	conn := twice.Conn()
	// A racing writer's copies of the originals (not of their twins).
	if err := conn.Exec(ctx, "INSERT INTO "+twiceDB+".events ("+analytics.EventColumns+") SELECT "+analytics.EventColumns+
		" FROM "+twiceDB+".events WHERE has(?, audit_id)", doubled); err != nil {
		t.Fatal(err)
	}
	if err := twice.ScanDuplicates(ctx, t0.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	totals := func(o Options, instantKey bool) Totals {
		t.Helper()
		o.setDefaults()
		if err := o.split(ctx, conn); err != nil {
			t.Fatal(err)
		}
		o.keyedByInstant = instantKey
		var tt Totals
		if err := o.querier(ctx, conn).each(QueryTotals, tt.scan); err != nil {
			t.Fatal(err)
		}
		return tt
	}
	for _, w := range [][2]time.Time{
		{t0.Add(17 * time.Minute), t0.Add(3*time.Hour + 41*time.Minute)},
		{t0.Add(-50 * time.Minute), t0.Add(4*time.Hour + 10*time.Minute)},
		{t0.Add(5 * time.Minute), t0.Add(50 * time.Minute)},
	} {
		o := Options{Cluster: "c1", Top: 1000, Since: w[0], Until: w[1]}
		o.Database = onceDB
		want, err := Build(ctx, once.Conn(), o)
		if err != nil {
			t.Fatal(err)
		}
		o.Database = twiceDB
		got, err := Build(ctx, conn, o)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("window [%s, %s): the report with duplicates and their twins differs\n got %+v\nwant %+v", w[0], w[1], got, want)
		}
		if byInstant := totals(o, true); byInstant == want.Totals {
			t.Errorf("window [%s, %s): matched by instant the totals are right too (%+v): no twin is in the window's raw edges, the test proves nothing",
				w[0], w[1], byInstant)
		}
	}
}
