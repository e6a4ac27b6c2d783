package report

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

// randomRows are skewed audit rows over [t0-1h, t0+5h): a few writers and
// objects take most writes, with every kind of 409, stampless updates,
// expired lists, leases, dry runs, other stages and another cluster.
func randomRows(seed uint64, n int) []audit.Row {
	rnd := rand.New(rand.NewPCG(seed, 7))
	zipf := func(k int) int { return int(float64(k) * rnd.Float64() * rnd.Float64() * rnd.Float64()) }
	s := &scenario{}
	span := 6 * time.Hour
	for range n {
		at := -time.Hour + time.Duration(rnd.Int64N(int64(span/time.Microsecond)))*time.Microsecond
		user := fmt.Sprintf("user-%d", zipf(12))
		ns := fmt.Sprintf("ns-%d", zipf(4))
		name := fmt.Sprintf("obj-%d", zipf(40))
		res, group := "configmaps", ""
		if rnd.IntN(3) == 0 {
			res, group = "deployments", "apps"
		}
		verb := []string{"get", "list", "update", "update", "update", "patch", "create", "delete"}[rnd.IntN(8)]
		code := int32(200)
		var mod func(*audit.Row)
		switch p := rnd.IntN(100); {
		case verb == "list" && p < 10:
			code, mod = 410, func(r *audit.Row) {
				r.Reason, r.Message = "Expired", "The resourceVersion for the provided list is too old."
			}
		case verb == "update" && p < 30:
			code = 409
		case verb == "update" && p < 40:
			mod = func(r *audit.Row) { r.Stamp = "" }
		case verb == "patch" && p < 20:
			code, mod = 409, func(r *audit.Row) {
				r.Message, r.CauseReasons, r.CauseFields = `Apply failed with 1 conflict: conflict with "x": .data.x`, []string{"FieldManagerConflict"}, []string{".data.x"}
			}
		case verb == "create" && p < 30:
			code, mod = 409, func(r *audit.Row) { r.Reason, r.Message = "AlreadyExists", `configmaps "a" already exists` }
		case verb == "delete" && p < 20:
			code, mod = 409, func(r *audit.Row) {
				r.Message = `Operation cannot be fulfilled: the UID in the precondition (1) does not match the UID in record (2). The object might have been deleted and then recreated`
			}
		case p < 3:
			code, mod = 409, func(r *audit.Row) { r.Message = "denied by quota-webhook" }
		case p < 5:
			mod = func(r *audit.Row) { r.DryRun = true }
		case p < 7:
			mod = func(r *audit.Row) { r.Stage = audit.StageRequestReceived }
		case p < 8:
			mod = func(r *audit.Row) { r.Cluster = "c2" }
		case p < 10:
			mod = func(r *audit.Row) { r.ImpersonatedUser = "imp-" + user }
		}
		stamp := fmt.Sprint(rnd.IntN(1000))
		s.add(at, user, verb, group, res, ns, name, code, func(r *audit.Row) {
			if verb == "update" {
				r.Stamp = stamp
			}
			if mod != nil {
				mod(r)
			}
		})
	}
	return s.rows
}

// rollupUsed says whether the report over o reads whole hours from the
// hour caches.
func rollupUsed(t *testing.T, conn driver.Conn, o Options) bool {
	t.Helper()
	if err := o.split(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	return len(o.plan.Clean) > 0
}

// minutesUsed says whether the report over o reads minute caches.
func minutesUsed(t *testing.T, conn driver.Conn, o Options) bool {
	t.Helper()
	if err := o.split(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	return len(o.plan.Partial) > 0
}

// writersUsed says whether the report over o reads its counters by
// writer from the writer caches.
func writersUsed(t *testing.T, conn driver.Conn, o Options) bool {
	t.Helper()
	o.setDefaults()
	if err := o.split(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	return o.querier(t.Context(), conn).binder.WriterCaches()
}

// compact builds the caches of every hour the test stored.
func compact(t *testing.T, store *store.Store) {
	t.Helper()
	res, err := store.Compact(t.Context(), time.Unix(0, 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hours) == 0 {
		t.Fatal("nothing to compact")
	}
}

func assertSameReports(t *testing.T, ctx context.Context, conn driver.Conn, o Options) {
	t.Helper()
	rolled, err := Build(ctx, conn, o)
	if err != nil && !errors.Is(err, ErrNoEvents) {
		t.Fatalf("rollup report over [%s, %s): %v", o.Since, o.Until, err)
	}
	o.NoRollup = true
	raw, rawErr := Build(ctx, conn, o)
	if rawErr != nil && !errors.Is(rawErr, ErrNoEvents) {
		t.Fatalf("raw report over [%s, %s): %v", o.Since, o.Until, rawErr)
	}
	if !errors.Is(err, rawErr) || !reflect.DeepEqual(rolled, raw) {
		t.Errorf("window [%s, %s) filters %q/%q/%q: rollup and raw differ\nrollup %+v\n   raw %+v",
			o.Since, o.Until, o.Namespace, o.Resource, o.User, rolled, raw)
	}
}

func migrated(t testing.TB) (*store.Store, string) {
	return migratedOn(t, chtest.Start(t))
}

// migratedOn is migrated in a new database of srv.
func migratedOn(t testing.TB, srv *chtest.Server) (*store.Store, string) {
	db := srv.NewDatabase(t)
	store, err := store.Open(t.Context(), store.Options{DSN: srv.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return store, db
}

// TestRollupEqualsRaw proves that the report read from the hour caches
// equals the raw-only computation: on the scenario of TestBuild and on
// random skewed rows, every batch delivered twice through Store.Insert,
// over windows that cut hours in the middle at microsecond precision, with
// and without filters (every conflict class, stampless updates, 410s, dry
// runs, other stages and clusters occur in the rows).
func TestRollupEqualsRaw(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	rows := append(buildScenario().rows, randomRows(3, 6000)...)
	rand.New(rand.NewPCG(4, 5)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	for i := 0; i < len(rows); i += 700 {
		batch := rows[i:min(i+700, len(rows))]
		for range 2 {
			if _, err := store.InsertRecords(ctx, recordtest.Set(batch, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	compact(t, store)

	base := Options{Database: db, Cluster: "c1", Top: 1000}
	windows := [][2]time.Time{
		{t0, t0.Add(time.Hour)},
		{t0.Add(-time.Hour), t0.Add(5 * time.Hour)},
		{t0.Add(35 * time.Second), t0.Add(3*time.Hour + 1)},
		{t0.Add(-30 * time.Minute), t0.Add(2*time.Hour + time.Microsecond)},
		{t0.Add(time.Hour - time.Microsecond), t0.Add(2*time.Hour + time.Microsecond)},
	}
	rnd := rand.New(rand.NewPCG(8, 9))
	for range 4 {
		a := t0.Add(-time.Hour + time.Duration(rnd.Int64N(int64(3*time.Hour/time.Microsecond)))*time.Microsecond)
		b := a.Add(time.Duration(rnd.Int64N(int64(3*time.Hour/time.Microsecond))) * time.Microsecond)
		windows = append(windows, [2]time.Time{a, b})
	}
	split, minutes, writers := 0, 0, 0
	for _, w := range windows {
		o := base
		o.Since, o.Until = w[0], w[1]
		if rollupUsed(t, store.Conn(), o) {
			split++
		}
		if minutesUsed(t, store.Conn(), o) {
			minutes++
		}
		for _, f := range []Options{{}, {User: "user-0"}, {Resource: "deployments", User: "user-1"}, {Namespace: "ns-1", Resource: "deployments"}, {Namespace: "shop", Resource: "configmaps", User: "dave"}} {
			f.Database, f.Cluster, f.Top, f.Since, f.Until = o.Database, o.Cluster, o.Top, o.Since, o.Until
			if writersUsed(t, store.Conn(), f) {
				if f.Namespace != "" {
					t.Fatalf("a report narrowed to namespace %s reads the writer caches, which keep no namespace", f.Namespace)
				}
				writers++
			}
			assertSameReports(t, ctx, store.Conn(), f)
		}
	}
	if split < 4 || minutes < 4 || writers < 8 {
		t.Fatalf("only %d windows read the rollup, %d the minute caches; %d reports the writer caches", split, minutes, writers)
	}

	// The scenario's expectations hold on the rollup path too, over a
	// window that cuts hours on both sides.
	o := base
	o.Since, o.Until = t0.Add(-30*time.Minute), t0.Add(90*time.Minute)
	o.User = "frank"
	r, err := Build(ctx, store.Conn(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := []StamplessUpdates{{User: "frank", Resource: "configmaps", Namespace: "shop", Name: "d", Count: 4}}
	if !reflect.DeepEqual(r.StamplessUpdates, want) {
		t.Errorf("stampless: got %+v, want %+v", r.StamplessUpdates, want)
	}
}

// TestRollupEqualsRawOnSynthetic compares both paths on the benchmark's
// generator, over windows cutting hours in the middle.
func TestRollupEqualsRawOnSynthetic(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	if err := Synthesize(ctx, store.Conn(), db, "bench", 200_000, 42, t0, 6*time.Hour); err != nil {
		t.Fatal(err)
	}
	compact(t, store)
	base := Options{Database: db, Cluster: "bench", Top: 50}
	for _, w := range [][2]time.Duration{
		{0, 6 * time.Hour},
		{17*time.Minute + 3*time.Microsecond, 4*time.Hour + 59*time.Minute},
		{90 * time.Minute, 150*time.Minute + 1},
		{-time.Hour, 3*time.Hour + 30*time.Minute},
	} {
		o := base
		o.Since, o.Until = t0.Add(w[0]), t0.Add(w[1])
		assertSameReports(t, ctx, store.Conn(), o)
		o.Resource = "configmaps"
		assertSameReports(t, ctx, store.Conn(), o)
	}
}

// TestCachesOfEarlierCompactions: an hour compacted by an earlier release
// (its record in hour_compactions, or in hour_caches with another layout)
// lacks caches of this layout, so no reader takes it as clean: the report
// reads it from events and says the same, and the compactor compacts it
// again, after which the report reads the caches once more.
func TestCachesOfEarlierCompactions(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	conn := store.Conn()
	if err := Synthesize(ctx, conn, db, "bench", 50_000, 7, t0, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	compact(t, store)
	o := Options{Database: db, Cluster: "bench", Top: 50, Since: t0.Add(10*time.Minute + 3*time.Second), Until: t0.Add(2*time.Hour + 50*time.Minute + 1)}
	if !rollupUsed(t, conn, o) || !minutesUsed(t, conn, o) || !writersUsed(t, conn, o) {
		t.Fatal("the window does not read the hour, minute and writer caches")
	}
	every, err := Build(ctx, conn, o)
	if err != nil {
		t.Fatal(err)
	}
	// What earlier releases left: the records of migration 5's table, and
	// one of another layout; their versions have no agent or latency
	// caches.
	for _, q := range []string{
		"INSERT INTO " + db + ".hour_compactions (event_date, hour, version, marks, compacted_at) SELECT event_date, hour, version, marks, compacted_at FROM " + db + ".hour_caches",
		"TRUNCATE TABLE " + db + ".hour_caches",
		"INSERT INTO " + db + ".hour_caches (event_date, hour, layout, version, marks, compacted_at) SELECT event_date, hour, toUInt32(" + strconv.Itoa(asql.CacheLayout-1) + "), version, marks, compacted_at FROM " + db + ".hour_compactions",
		"TRUNCATE TABLE " + db + ".hour_agent_requests",
		"TRUNCATE TABLE " + db + ".minute_agent_requests",
		"TRUNCATE TABLE " + db + ".minute_write_latencies",
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var records uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".hour_caches WHERE layout != "+strconv.Itoa(asql.CacheLayout)).Scan(&records); err != nil || records != 3 {
		t.Fatalf("%d records of another layout (%v), want 3", records, err)
	}
	if rollupUsed(t, conn, o) || minutesUsed(t, conn, o) {
		t.Fatal("hours compacted by an earlier release are read from their caches")
	}
	earlier, err := Build(ctx, conn, o)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(every, earlier) {
		t.Errorf("from the caches:\n%+v\nfrom events, the hours compacted earlier:\n%+v", every, earlier)
	}
	res, err := store.Compact(ctx, time.Unix(0, 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hours) != 3 {
		t.Fatalf("compacted %v again, want the 3 hours an earlier release compacted", res.Hours)
	}
	if !rollupUsed(t, conn, o) || !minutesUsed(t, conn, o) {
		t.Fatal("the hours compacted again are not read from their caches")
	}
	again, err := Build(ctx, conn, o)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(every, again) {
		t.Errorf("before:\n%+v\nafter compacting again:\n%+v", every, again)
	}
	assertSameReports(t, ctx, conn, o)
}

// TestHotObjectsMatchPlainRanking checks the contender shortcut of
// QueryHotObjects against the plain ranking (every object, its distinct
// writers counted), written independently over raw events, for lists
// shorter and longer than the number of conflicted objects.
func TestHotObjectsMatchPlainRanking(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	if err := Synthesize(ctx, store.Conn(), db, "bench", 100_000, 7, t0, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	plain := `SELECT api_group, resource, namespace, name, countIf(w) AS attempts, uniqExactIf(writer, w) AS writers,
		countIf(w AND code = 409 AND position(message, 'the object has been modified') > 0) AS conflicts
	FROM (SELECT *, verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io') AS w
		FROM ` + db + `.events_by_hour
		WHERE stage IN ('ResponseComplete', 'Panic') AND dry_run = 0 AND cluster = 'bench' AND event_time_us >= ? AND event_time_us < ?)
	GROUP BY api_group, resource, namespace, name
	HAVING attempts > 0
	ORDER BY conflicts DESC, writers DESC, attempts DESC, api_group, resource, namespace, name
	LIMIT ?`
	var n int64
	if err := store.Conn().QueryRow(ctx, "SELECT toInt64(uniqExact(api_group, resource, namespace, name)) FROM "+db+".events_by_hour WHERE code = 409 AND position(message, 'the object has been modified') > 0").Scan(&n); err != nil {
		t.Fatal(err)
	}
	conflicted := int(n)
	if conflicted < 5 {
		t.Fatalf("only %d conflicted objects: the shortcut is not exercised", conflicted)
	}
	for _, top := range []int{1, 3, conflicted, conflicted + 20} {
		for _, w := range [][2]time.Duration{{0, 2 * time.Hour}, {13 * time.Minute, 97 * time.Minute}} {
			o := Options{Database: db, Cluster: "bench", Top: top, Since: t0.Add(w[0]), Until: t0.Add(w[1])}
			r, err := Build(ctx, store.Conn(), o)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := store.Conn().Query(ctx, plain, uint64(o.Since.UnixMicro()), uint64(o.Until.UnixMicro()), top)
			if err != nil {
				t.Fatal(err)
			}
			want := []HotObject{}
			for rows.Next() {
				var h HotObject
				if err := rows.Scan(&h.APIGroup, &h.Resource, &h.Namespace, &h.Name, &h.WriteAttempts, &h.DistinctWriters, &h.VersionConflicts); err != nil {
					t.Fatal(err)
				}
				want = append(want, h)
			}
			rows.Close()
			if !reflect.DeepEqual(r.HotObjects, want) {
				t.Errorf("top %d over %v: got\n%+v\nwant\n%+v", top, w, r.HotObjects, want)
			}
		}
	}
}
