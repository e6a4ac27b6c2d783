package report

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/analytics/store/enginetest"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/testenv"
)

// The cross-engine suite (analytics/store/enginetest): the report tests'
// rows on ClickHouse 18.16 and 26.7, and every statement the store and the
// report send to 18.16, taken from its query log, run on both.

// reportShapes are the windows the report is compared over, on the rows
// of engineRows.
func reportShapes(db string) map[string]Options {
	base := Options{Database: db, Cluster: "c1", Top: 1000}
	with := func(f func(*Options)) Options { o := base; f(&o); return o }
	return map[string]Options{
		"no rollup": with(func(o *Options) {
			o.Since, o.Until, o.NoRollup = t0.Add(-time.Hour), t0.Add(5*time.Hour), true
		}),
		"rollup only":       with(func(o *Options) { o.Since, o.Until = t0, t0.Add(4*time.Hour) }),
		"the field history": with(func(o *Options) { o.Since, o.Until, o.History = t0.Add(-time.Hour), t0.Add(5*time.Hour), true }),
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

// TestEnginesAgree proves every statement of the store and the report on
// ClickHouse 26.7 against 18.16, over the same rows.
func TestEnginesAgree(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and loads ClickHouse 26.7 (chDB)")
	ch := chtest.Start(t)
	e := chdbtest.Open(t)
	ctx := t.Context()

	en := enginetest.New(t, ch, e)
	if n := en.SameAnswers(t, "", en.Schema()); n < len(store.Migrations) {
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
	// that repeat rows (a redelivery inserts copies), and by two writers
	// storing the same events at one moment.
	rows := engineRows()
	dead := []audit.DeadLetter{{Cluster: "c1", Source: "webhook", Reason: "not JSON", Raw: "{\"kind\":", ReceivedAt: t0.UnixMicro()}}
	conn := en.Store.Conn()
	// 18.16 must not merge the copies away before they are copied to 26.7.
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES "+en.DB+".events_by_hour"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(rows); i += 1000 {
		batch := rows[max(i-100, 0):min(i+1000, len(rows))]
		if _, err := en.Store.InsertRecords(ctx, recordtest.Set(batch, dead[:min(i, 1)])); err != nil {
			t.Fatal(err)
		}
	}
	rival, err := store.Open(ctx, store.Options{DSN: ch.DatabaseDSN(en.DB) + "&log_queries=1", Database: en.DB})
	if err != nil {
		t.Fatal(err)
	}
	defer rival.Close()
	s := &scenario{n: 300_000}
	for i := range 20 {
		s.add(time.Duration(i)*time.Second, "racer", "update", "", "configmaps", "ns-2", fmt.Sprintf("obj-%d", i%3), 200, nil)
	}
	var errs [2]error
	var wg sync.WaitGroup
	for i, st := range []*store.Store{en.Store, rival} {
		wg.Go(func() { _, errs[i] = st.InsertRecords(ctx, recordtest.Set(s.rows, nil)) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	// Every fifth event stored once more by a plain INSERT, as a retry of
	// an insert applied in part would.
	if err := conn.Exec(ctx, "INSERT INTO "+en.DB+".events_by_hour ("+record.EventColumns+") SELECT "+record.EventColumns+
		" FROM "+en.DB+".events_by_hour WHERE cityHash64(audit_id) % 5 = 0"); err != nil {
		t.Fatal(err)
	}
	en.Recorded(t, "load")

	// The compaction of every hour: its reads are compared, its inserts
	// replayed on 26.7 (with 18.16's versions and counts of marks, as
	// recorded), so that both engines build the caches from their events.
	compacted, err := en.Store.Compact(ctx, t0.Add(-30*24*time.Hour), 0)
	if err != nil || len(compacted.Hours) == 0 {
		t.Fatalf("compact: %+v, %v", compacted, err)
	}
	compaction := en.Recorded(t, "compaction")
	en.CopyTo26(t)
	replayed := 0
	for _, s := range compaction {
		if strings.HasPrefix(strings.TrimSpace(s.SQL), "INSERT") {
			e.Exec(t, s.SQL)
			replayed++
		}
	}
	if replayed == 0 {
		t.Fatal("the compaction inserted nothing")
	}
	if n := en.SameAnswers(t, "", enginetest.Selects(compaction)); n == 0 {
		t.Error("the compaction's reads were empty on both")
	}
	if err := conn.Exec(ctx, "SYSTEM START MERGES "+en.DB+".events_by_hour"); err != nil {
		t.Fatal(err)
	}
	en.Recorded(t, "merges")

	t.Run("tables", func(t *testing.T) {
		if n := en.SameAnswers(t, "", en.Tables(t)); n < len(rows) {
			t.Errorf("the tables held %d rows in all, fewer than the %d events", n, len(rows))
		}
	})

	shapes := reportShapes(en.DB)
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		t.Run("report: "+name, func(t *testing.T) {
			if _, err := Build(ctx, en.Store.Conn(), shapes[name]); err != nil {
				t.Fatalf("18.16: %v", err)
			}
			stmts := en.Recorded(t, name)
			if want := len(Statements(shapes[name])); len(stmts) < want {
				t.Fatalf("the report ran %d statements, fewer than its %d", len(stmts), want)
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

	// Every hour compacted again a second later, on both engines: the
	// first versions are superseded with the blocks built from them, both
	// engines list the same ones, and the deletes leave the same tables.
	t.Run("pruning superseded cache versions", func(t *testing.T) {
		time.Sleep(1100 * time.Millisecond)
		for _, h := range compacted.Hours {
			if err := en.Store.CompactHour(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range en.Recorded(t, "recompaction") {
			if strings.HasPrefix(strings.TrimSpace(s.SQL), "INSERT") {
				e.Exec(t, s.SQL)
			}
		}
		time.Sleep(1100 * time.Millisecond) // past every record, on both clocks
		list := func(name, sql string) []enginetest.Statement {
			return []enginetest.Statement{{Name: name, SQL: strings.NewReplacer("{db}", en.DB, "@grace_s", "0").Replace(sql)}}
		}
		listing, blocks := list("superseded versions", asql.SupersededVersions), list("superseded blocks", asql.SupersededBlocks)
		if n := en.SameAnswers(t, "", listing); n != len(compacted.Hours) {
			t.Fatalf("%d superseded versions listed, want the first version of each of the %d hours", n, len(compacted.Hours))
		}
		// The blocks built from the first versions go with them.
		if n := en.SameAnswers(t, "", blocks); n != len(compacted.Blocks) || n == 0 {
			t.Fatalf("%d superseded blocks listed, want the %d built from the first versions", n, len(compacted.Blocks))
		}
		if n, err := en.Store.Prune(ctx, 0); err != nil || n != len(compacted.Hours)+len(compacted.Blocks) {
			t.Fatalf("18.16 pruned %d versions, %v; want %d hours' and %d blocks'", n, err, len(compacted.Hours), len(compacted.Blocks))
		}
		deletes := 0
		for _, s := range en.Recorded(t, "prune") {
			if strings.HasPrefix(s.SQL, "ALTER") {
				e.Exec(t, s.SQL+" SETTINGS mutations_sync = 2")
				deletes++
			}
		}
		if want := len(asql.CacheTables) + len(asql.RecordTables) + len(asql.BlockTables) + 1; deletes != want {
			t.Fatalf("the prune sent %d deletes, want one per cache, block and record table (%d)", deletes, want)
		}
		chtest.WaitForMutations(t, conn, en.DB)
		en.SameAnswers(t, "", en.Tables(t))
		if n := en.SameAnswers(t, "", slices.Concat(listing, blocks)); n != 0 {
			t.Errorf("%d superseded versions and blocks listed after the prune", n)
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
			listings[i].Norm = enginetest.Unordered // the listing has no order
		}
		if len(listings) == 0 {
			t.Fatal("retention listed no partitions")
		}
		en.SameAnswers(t, "", listings) // empty: nothing is that old
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
// the views the same tables, and the field history the same findings.
func TestSynthesizeAgrees(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and loads ClickHouse 26.7 (chDB)")
	ctx := t.Context()
	en := enginetest.New(t, chtest.Start(t), chdbtest.Open(t))
	if err := Synthesize(ctx, en.Store.Conn(), en.DB, "c1", 20_000, 42, t0, 6*time.Hour); err != nil {
		t.Fatalf("18.16: %v", err)
	}
	stmts := en.Recorded(t, "synthesize")
	if len(stmts) != 2 {
		t.Fatalf("Synthesize ran %d statements, want its two INSERTs (the field history, the events)", len(stmts))
	}
	for _, s := range stmts {
		if !strings.HasPrefix(strings.TrimSpace(s.SQL), "INSERT") {
			t.Fatalf("Synthesize ran %.200q, not an INSERT", s.SQL)
		}
		en.E.Exec(t, s.SQL)
	}
	if n := en.SameAnswers(t, "", en.Tables(t)); n < 20_000 {
		t.Errorf("the tables held %d rows, fewer than the 20,000 generated", n)
	}
	o := Options{Database: en.DB, Cluster: "c1", Top: 100_000, Since: t0, Until: t0.Add(6 * time.Hour), History: true}
	r, err := Build(ctx, en.Store.Conn(), o)
	if err != nil {
		t.Fatalf("18.16: %v", err)
	}
	if len(r.LostUpdates) == 0 || len(r.FieldFights) == 0 {
		t.Fatalf("the synthesized history shows %d lost updates and %d field fights: nothing to compare", len(r.LostUpdates), len(r.FieldFights))
	}
	history := slices.DeleteFunc(en.Recorded(t, "history"), func(s enginetest.Statement) bool {
		return !strings.Contains(s.SQL, "field_versions")
	})
	if len(history) < len(asql.HistoryStatements) {
		t.Fatalf("the report ran %d statements on the field history, fewer than the %d findings", len(history), len(asql.HistoryStatements))
	}
	if n := en.SameAnswers(t, "", history); n < len(r.LostUpdates) {
		t.Errorf("the history findings answered %d rows on both, fewer than the %d lost updates", n, len(r.LostUpdates))
	}
	// What suggest reads: the same answers on both, its new statements too.
	obs, err := Observe(ctx, en.Store.Conn(), o)
	if err != nil {
		t.Fatalf("18.16: %v", err)
	}
	if len(obs.Fields) == 0 || len(obs.Writers) == 0 {
		t.Fatalf("the synthesized history shows %d fields and %d field writers: nothing to compare", len(obs.Fields), len(obs.Writers))
	}
	observed := en.Recorded(t, "observe")
	if len(observed) < len(asql.SuggestStatements) {
		t.Fatalf("Observe ran %d statements, want its %d", len(observed), len(asql.SuggestStatements))
	}
	en.SameAnswers(t, "", observed)
}
