package report

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
)

// TestReportCountsDuplicatesOnce stores the same rows into two databases:
// once by a single writer, and once with a third of the events stored
// again by a plain INSERT (as a racing writer or a retried insert would)
// and a ninth a third time, into hours compacted before the copies came,
// then a replay of half the rows. The rows hold twins: two requests with
// the same user, verb, URI, code and timestamps under two audit IDs, which
// are two events. Over windows that cut hours, with and without filters,
// from the caches and raw, and in the dashboards' forms, the report of the
// second database must equal the single writer's, before and after the
// dirty hours are compacted again.
func TestReportCountsDuplicatesOnce(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	srv := chtest.Start(t)
	ctx := t.Context()
	rows := append(buildScenario().rows, randomRows(11, 6000)...)
	for i := 0; i < 3000; i += 5 {
		twin := rows[i]
		twin.AuditID += "-twin"
		rows = append(rows, twin)
	}
	rand.New(rand.NewPCG(12, 13)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	open := func() (*store.Store, string) {
		st, db := migratedOn(t, srv)
		for i := 0; i < len(rows); i += 700 {
			if _, err := st.InsertRecords(ctx, recordtest.Set(rows[i:min(i+700, len(rows))], nil)); err != nil {
				t.Fatal(err)
			}
		}
		compact(t, st)
		return st, db
	}
	once, onceDB := open()
	twice, twiceDB := open()
	conn := twice.Conn()
	// Merges would collapse the copies before the reads could meet them.
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES "+twiceDB+".events_by_hour"); err != nil {
		t.Fatal(err)
	}
	for _, mod := range []int{3, 9} {
		q := "INSERT INTO " + twiceDB + ".events_by_hour (" + record.EventColumns + ") SELECT " + record.EventColumns +
			" FROM " + twiceDB + ".events_by_hour WHERE cityHash64(audit_id) % ? = 0 LIMIT 1 BY cluster, audit_id, stage, fingerprint"
		if err := conn.Exec(ctx, q, mod); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := twice.InsertRecords(ctx, recordtest.Set(rows[:len(rows)/2], nil)); err != nil {
		t.Fatal(err)
	}
	var stored, distinct uint64
	if err := conn.QueryRow(ctx, "SELECT count(), uniqExact("+asql.Identity+") FROM "+twiceDB+".events_by_hour").Scan(&stored, &distinct); err != nil {
		t.Fatal(err)
	}
	if stored < distinct+uint64(len(rows)/2) {
		t.Fatalf("events holds %d rows of %d events: the copies merged away, the test proves nothing", stored, distinct)
	}
	compare(t, once, onceDB, twice, twiceDB, true)
	compact(t, twice)
	compare(t, once, onceDB, twice, twiceDB, false)
	for _, q := range []string{"SYSTEM START MERGES " + twiceDB + ".events_by_hour", "OPTIMIZE TABLE " + twiceDB + ".events_by_hour FINAL"} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	compare(t, once, onceDB, twice, twiceDB, false)
}

// compare requires the reports and panel queries of twiceDB to equal
// onceDB's: over every window and every filter (each window with one
// filter, in turn) when thorough, else over two of each, crossed.
func compare(t *testing.T, once *store.Store, onceDB string, twice *store.Store, twiceDB string, thorough bool) {
	t.Helper()
	ctx := t.Context()
	conn := twice.Conn()
	windows := [][2]time.Time{
		{t0, t0.Add(time.Hour)},
		{t0.Add(-time.Hour), t0.Add(5 * time.Hour)},
		{t0.Add(35 * time.Second), t0.Add(3*time.Hour + 1)},
		{t0.Add(-30 * time.Minute), t0.Add(2*time.Hour + time.Microsecond)},
		{t0.Add(time.Hour - time.Microsecond), t0.Add(2*time.Hour + time.Microsecond)},
	}
	filters := []Options{{}, {User: "user-0"}, {Namespace: "ns-1", Resource: "deployments"}, {Namespace: "shop", Resource: "configmaps", User: "dave"}}
	panels := [][2]time.Duration{{0, time.Hour - time.Second}, {-time.Hour, 5*time.Hour - time.Second}, {35 * time.Second, 3 * time.Hour}}
	if !thorough {
		windows, filters, panels = windows[1:3], filters[:2], panels[2:]
	}
	for wi, w := range windows {
		for fi, f := range filters {
			if thorough && fi != wi%len(filters) {
				continue
			}
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

	// The dashboards' forms of every statement answer as the single
	// writer's database does.
	vars := panelVariables
	values := map[string]string{"top": "1000", "gap_us": "300000000", "threshold": "5", "min_handoffs": "3", "min_writes": "10", "stale_us": "600000000", "storm_s": "600", "storm_rate": "0.2", "min_bucket_writes": "3", "verb": "''", "code": "''", "hide_system": "'no'"}
	// Each statement in one of the windows, in turn: the copies are a
	// matter of the rows a statement reads, not of the window's shape,
	// and the later checks run every statement in the window that cuts
	// hours.
	every := newRotation(len(panels), func(asql.Statement) bool { return true })
	for pi, w := range panels {
		e := asql.Expansion{From: t0.Add(w[0]), To: t0.Add(w[1]), Interval: 10 * time.Minute,
			Vars: map[string][]string{"cluster": {"c1"}, "name": {""}}, All: map[string]bool{"namespace": true, "resource": true, "user": true}}
		for _, st := range asql.All {
			if !every.runs(st, 0, pi) {
				continue
			}
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
	every.covered(t, 1)
}
