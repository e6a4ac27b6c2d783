package report

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
	"github.com/stampguard/stampguard/internal/enginetest"
	"github.com/stampguard/stampguard/internal/testenv"
)

// The cross-engine suite (internal/enginetest): the report tests' rows on
// ClickHouse 18.16 and 26.7, and every statement the store and the report
// send to 18.16, taken from its query log, run on both.

// reportShapes are the windows the report is compared over, on the rows
// of engineRows.
func reportShapes(db string) map[string]Options {
	base := Options{Database: db, Cluster: "c1", Top: 1000}
	with := func(f func(*Options)) Options { o := base; f(&o); return o }
	return map[string]Options{
		"no rollup": with(func(o *Options) {
			o.Since, o.Until, o.NoRollup = t0.Add(-time.Hour), t0.Add(5*time.Hour), true
		}),
		"rollup only": with(func(o *Options) { o.Since, o.Until = t0, t0.Add(4*time.Hour) }),
		"rollup with edges": with(func(o *Options) {
			o.Since, o.Until = t0.Add(-43*time.Minute+123*time.Microsecond), t0.Add(4*time.Hour+5*time.Minute)
		}),
		"a window cutting a loop": with(func(o *Options) { o.Since, o.Until = t0.Add(35*time.Second), t0.Add(time.Hour) }),
		"filters and the default top": with(func(o *Options) {
			o.Since, o.Until, o.Top, o.Namespace, o.Resource = t0.Add(-30*time.Minute), t0.Add(3*time.Hour+time.Second), 0, "ns-0", "configmaps"
		}),
		"three days, every partition": with(func(o *Options) { o.Since, o.Until = t0.Add(-72*time.Hour), t0.Add(24*time.Hour) }),
	}
}

// engineRows are the report tests' scenario and random skewed rows, plus
// a few on the two days before, for retention to drop.
func engineRows() []audit.Row {
	rows := append(buildScenario().rows, randomRows(11, 3000)...)
	old := &scenario{n: 100_000}
	for i := range 6 {
		at := -time.Duration(24+i*5) * time.Hour
		old.add(at, "old-writer", "update", "", "configmaps", "ns-0", "obj-0", []int32{200, 409}[i%2], nil)
	}
	return append(rows, old.rows...)
}

var partitionQuotes = regexp.MustCompile(`'(\d{4}-\d{2}-\d{2})'`)

// TestEnginesAgree proves every statement of the store and the report on
// ClickHouse 26.7 against 18.16, over the same rows.
func TestEnginesAgree(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and loads ClickHouse 26.7 (chDB)")
	ch := chtest.Start(t)
	e := chdbtest.Open(t)
	ctx := t.Context()

	en := enginetest.New(t, ch, e)
	if n := en.SameAnswers(t, "", en.Schema()); n < len(analytics.Migrations) {
		t.Fatalf("the schema comparison saw %d rows", n)
	}
	t.Run("migrating twice applies nothing", func(t *testing.T) {
		if again, err := en.Store.Migrate(ctx); err != nil || len(again) != 0 {
			t.Errorf("18.16: applied %v, %v", again, err)
		}
		if again := en.Migrate26(t); len(again) != 0 {
			t.Errorf("26.7: applied %v", again)
		}
		en.SameAnswers(t, "", en.Schema())
	})

	// 18.16 is written through the product's writer path, in batches
	// that repeat rows (the store drops what it stored before).
	rows := engineRows()
	dead := []audit.DeadLetter{{Cluster: "c1", Source: "webhook", Reason: "not JSON", Raw: "{\"kind\":", ReceivedAt: t0.UnixMicro()}}
	for i := 0; i < len(rows); i += 1000 {
		batch := rows[max(i-100, 0):min(i+1000, len(rows))]
		if _, err := en.Store.Insert(ctx, batch, dead[:min(i, 1)]); err != nil {
			t.Fatal(err)
		}
	}
	en.Recorded(t, "load") // the loading statements; the lookups follow

	// The writer's stored-keys lookup, for a batch half stored before:
	// its keys travel as the external table batch_keys, which on 26.7
	// (and on 18.16 over HTTP) is a temporary table of the session. One
	// new event is of another cluster: each cluster's check then sees
	// parts holding more rows than its own, so it reads (after a quiet
	// one-cluster insert the check reads nothing).
	batch := append(slices.Clone(rows[:20]), func() []audit.Row {
		s := &scenario{n: 200_000}
		for i := range 5 {
			s.add(time.Duration(i)*time.Minute, "late", "update", "", "configmaps", "ns-1", "obj-9", 200, nil)
		}
		s.add(6*time.Minute, "late", "update", "", "configmaps", "ns-1", "obj-9", 200, func(r *audit.Row) { r.Cluster = "c2" })
		return s.rows
	}()...)
	if res, err := en.Store.Insert(ctx, batch, nil); err != nil || res.Stored != 6 {
		t.Fatalf("insert a half-stored batch: %+v, %v", res, err)
	}
	// Two writers store the same fresh events at one moment: both lookups
	// miss them and both insert, and a check that reads after both
	// inserts finds their hashes repeated and reads their keys (the
	// check's second statement). Whether a round races is the servers'
	// timing: rounds run until one did.
	rival, err := analytics.OpenStore(ctx, analytics.StoreOptions{DSN: ch.DatabaseDSN(en.DB) + "&log_queries=1", Database: en.DB})
	if err != nil {
		t.Fatal(err)
	}
	defer rival.Close()
	raced := false
	for round := 0; round < 20 && !raced; round++ {
		s := &scenario{n: 300_000 + 100*round}
		for i := range 20 {
			s.add(time.Duration(i)*time.Second, "racer", "update", "", "configmaps", "ns-2", fmt.Sprintf("obj-%d", i%3), 200, nil)
		}
		var results [2]analytics.InsertResult
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, st := range []*analytics.Store{en.Store, rival} {
			wg.Go(func() {
				<-start
				results[i], errs[i] = st.Insert(ctx, s.rows, nil)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatal(err)
		}
		raced = results[0].Doubled+results[1].Doubled > 0
	}
	if !raced {
		t.Fatal("20 rounds of two writers storing the same events at once: none raced")
	}
	var lookups []enginetest.Statement
	var partNamed []string // the check of recent parts, as recorded
	for _, s := range enginetest.Selects(en.Recorded(t, "stored-keys lookup")) {
		if strings.Contains(s.SQL, "batch_keys") || partFilter.MatchString(s.SQL) {
			s.Norm = enginetest.Unordered // the store takes the keys as a set
			// The check after the insert names the parts 18.16 wrote
			// since the lookup; part names are each engine's own. It must
			// run on 26.7 as recorded, and it is compared without the
			// names (over every part).
			if partFilter.MatchString(s.SQL) {
				partNamed = append(partNamed, s.SQL)
				s.SQL = partFilter.ReplaceAllString(s.SQL, "")
			}
			lookups = append(lookups, s)
		}
	}
	if len(lookups) == len(partNamed) {
		t.Fatal("the store's insert ran no lookup that reads batch_keys: the suite must learn the new lookup")
	}
	if len(partNamed) == 0 {
		t.Fatal("the store's insert ran no check of recent parts: the suite must learn the new check")
	}
	if !slices.ContainsFunc(partNamed, func(q string) bool { return strings.Contains(q, "GROUP BY audit_id") }) {
		t.Fatal("no check read the keys of repeated hashes: the raced round did not reach the check's second statement")
	}
	// Racing writers: every fifth event stored once more by a plain INSERT
	// (as a second writer's would be: the views count the copy), the copies
	// recorded by the scan. 18.16 must not merge the copies away before
	// they are copied to 26.7, whose views then count them too.
	conn := en.Store.Conn()
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES "+en.DB+".events"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, "INSERT INTO "+en.DB+".events ("+analytics.EventColumns+") SELECT "+analytics.EventColumns+
		" FROM "+en.DB+".events WHERE cityHash64(audit_id) % 5 = 0"); err != nil {
		t.Fatal(err)
	}
	if err := en.Store.ScanDuplicates(ctx, t0.Add(-30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var doubled uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+en.DB+".duplicate_events").Scan(&doubled); err != nil || doubled == 0 {
		t.Fatalf("the scan recorded %d copies (%v)", doubled, err)
	}
	en.Recorded(t, "racing copies")
	// Both racing writers, and the scan, recorded some copies: merge
	// duplicate_events to one row per event, as 26.7 stores a block of
	// such rows (optimize_on_insert), so that raw counts compare.
	if err := conn.Exec(ctx, "OPTIMIZE TABLE "+en.DB+".duplicate_events FINAL"); err != nil {
		t.Fatal(err)
	}
	en.CopyTo26(t)
	if err := conn.Exec(ctx, "SYSTEM START MERGES "+en.DB+".events"); err != nil {
		t.Fatal(err)
	}
	en.Recorded(t, "merges")

	t.Run("tables", func(t *testing.T) {
		if n := en.SameAnswers(t, "", en.Tables(t)); n < len(rows) {
			t.Errorf("the tables held %d rows in all, fewer than the %d events", n, len(rows))
		}
	})

	t.Run("stored-keys lookup", func(t *testing.T) {
		var keys strings.Builder
		for _, r := range batch {
			keys.WriteString(r.AuditID + "\n")
		}
		setup := []string{
			"CREATE TEMPORARY TABLE batch_keys (audit_id String)",
			"INSERT INTO batch_keys (audit_id) FORMAT TabSeparated\n" + keys.String(),
		}
		session := "lookup-" + en.DB
		for _, q := range setup {
			if _, err := ch.QueryText(t, session, q, ""); err != nil {
				t.Fatal(err)
			}
		}
		e.Exec(t, setup...)
		defer func() { _, _ = e.Query("DROP TEMPORARY TABLE IF EXISTS batch_keys", "") }()
		for _, q := range partNamed {
			if _, err := e.Query(q, ""); err != nil {
				t.Errorf("the check of recent parts on 26.7: %v\nin:\n%.2000s", err, q)
			}
		}
		if n := en.SameAnswers(t, session, lookups); n < len(batch) {
			t.Errorf("the lookups found %d stored keys, want all %d of the batch", n, len(batch))
		}
	})

	shapes := reportShapes(en.DB)
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		t.Run("report: "+name, func(t *testing.T) {
			if _, err := Build(ctx, en.Store.Conn(), shapes[name]); err != nil {
				t.Fatalf("18.16: %v", err)
			}
			stmts := en.Recorded(t, name)
			if len(stmts) < len(All) {
				t.Fatalf("the report ran %d statements, fewer than the %d of All", len(stmts), len(All))
			}
			if n := en.SameAnswers(t, "", stmts); n == 0 {
				t.Error("every answer was empty")
			}
		})
	}

	t.Run("an empty database says no requests on both", func(t *testing.T) {
		empty := enginetest.New(t, ch, e)
		o := reportShapes(empty.DB)["rollup with edges"]
		if _, err := Build(ctx, empty.Store.Conn(), o); !errors.Is(err, ErrNoEvents) {
			t.Fatalf("18.16: %v, want ErrNoEvents", err)
		}
		stmts := empty.Recorded(t, "empty")
		empty.SameAnswers(t, "", append(stmts, empty.Tables(t)...))
		totals := slices.IndexFunc(stmts, func(s enginetest.Statement) bool { return strings.Contains(s.SQL, "sum(requests)") })
		if totals < 0 {
			t.Fatal("no totals statement among the report's")
		}
		if out, err := e.Query(stmts[totals].SQL, "TabSeparated"); err != nil || !strings.HasPrefix(out, "0\t") {
			t.Errorf("26.7 totals on an empty database: %q, %v; want 0 requests", out, err)
		}
	})

	// Last: it drops partitions. A cutoff before every row drops nothing
	// and shows the listing; then two days go on 18.16, and the same
	// ALTERs on 26.7 must leave the same tables.
	t.Run("retention", func(t *testing.T) {
		if days, err := en.Store.DropPartitionsBefore(ctx, t0.Add(-30*24*time.Hour)); err != nil || len(days) != 0 {
			t.Fatalf("18.16 dropped %v, %v before every row", days, err)
		}
		listings := enginetest.Selects(en.Recorded(t, "retention listing"))
		for i := range listings {
			// 18.16 shows a Date partition as 2026-11-29, 26.7 as
			// '2026-11-29'; the store reads both. The listing has no order.
			listings[i].Norm = func(s string) string { return enginetest.Unordered(partitionQuotes.ReplaceAllString(s, "$1")) }
		}
		if len(listings) == 0 {
			t.Fatal("retention listed no partitions")
		}
		if n := en.SameAnswers(t, "", listings); n == 0 {
			t.Error("the listings were empty")
		}
		days, err := en.Store.DropPartitionsBefore(ctx, t0.Truncate(24*time.Hour))
		if err != nil || len(days) != 2 {
			t.Fatalf("18.16 dropped %v, %v; want the two days before", days, err)
		}
		for _, s := range en.Recorded(t, "retention") {
			if strings.HasPrefix(s.SQL, "ALTER") {
				e.Exec(t, s.SQL)
			}
		}
		en.SameAnswers(t, "", en.Tables(t))
	})
}

// TestSynthesizeAgrees runs the benchmarks' generator on both engines: it
// generates inside the server, so the same seed must give the same rows,
// and the views the same tables.
func TestSynthesizeAgrees(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and loads ClickHouse 26.7 (chDB)")
	en := enginetest.New(t, chtest.Start(t), chdbtest.Open(t))
	if err := Synthesize(t.Context(), en.Store.Conn(), en.DB, "c1", 20_000, 42, t0, 6*time.Hour); err != nil {
		t.Fatalf("18.16: %v", err)
	}
	stmts := en.Recorded(t, "synthesize")
	if len(stmts) != 1 || !strings.HasPrefix(strings.TrimSpace(stmts[0].SQL), "INSERT") {
		t.Fatalf("Synthesize ran %d statements, want its one INSERT", len(stmts))
	}
	en.E.Exec(t, stmts[0].SQL)
	if n := en.SameAnswers(t, "", en.Tables(t)); n < 20_000 {
		t.Errorf("the tables held %d rows, fewer than the 20,000 generated", n)
	}
}

// partFilter is the recent-parts check's condition on part names.
var partFilter = regexp.MustCompile(` AND _part IN \([^)]*\)`)
