package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
	"github.com/stampguard/stampguard/internal/testenv"
)

// The cross-engine suite: the same rows on ClickHouse 18.16 (a real
// server, written and read through the product's Store and driver) and on
// 26.7 (chDB in the test process, which has no native protocol), and every
// statement the product runs, run on both, their answers compared byte for
// byte: column types and rows as TabSeparatedWithNamesAndTypes, without
// the names (ClickHouse names unaliased expressions after their text).
//
// The statements are not rendered by hand: the product runs them on 18.16
// with log_queries = 1, and the suite takes the text the server received,
// parameters bound by the driver, from system.query_log. So whatever Build,
// Store.Insert and DropPartitionsBefore send, the suite proves on 26.7, and
// new statements join without changes here. The migrations run on 26.7
// from their SQL (Migrate is SQL text only), driven by 26.7's own answers.
// Statements of other parts of the product (the dashboards' panels, say)
// join as a []engineStatement passed to sameAnswers.

// engineStatement is one statement run on both engines.
type engineStatement struct {
	name, sql string
	// norm, when set, rewrites both answers before they are compared, for
	// a difference the product reads through (say so where it is set).
	norm func(string) string
}

// engines is one database on both engines.
type engines struct {
	ch    *chtest.Server
	e     *chdbtest.Engine
	db    string
	store *analytics.Store // writes to 18.16; its queries are logged
	seen  map[string]bool  // query ids already taken from the log
}

// newEngines creates database db on both and migrates it: 18.16 with
// Store.Migrate, 26.7 with the same SQL.
func newEngines(t *testing.T, ch *chtest.Server, e *chdbtest.Engine) *engines {
	t.Helper()
	db := ch.NewDatabase(t)
	// Unknown DSN parameters become settings: this store's queries go to
	// the query log, where recorded() finds them.
	store, err := analytics.OpenStore(t.Context(), analytics.StoreOptions{DSN: ch.DatabaseDSN(db) + "&log_queries=1", Database: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	en := &engines{ch: ch, e: e, db: db, store: store, seen: map[string]bool{}}
	applied, err := store.Migrate(t.Context())
	if err != nil {
		t.Fatalf("migrate 18.16: %v", err)
	}
	if got := en.migrate26(t); !slices.Equal(got, applied) {
		t.Fatalf("migrations applied: 18.16 %v, 26.7 %v", applied, got)
	}
	t.Cleanup(func() { _, _ = e.Query("DROP DATABASE IF EXISTS "+db+" SYNC", "") })
	en.recorded(t, "migrate") // proven above, statement by statement
	return en
}

// migrate26 is Store.Migrate on 26.7: the same SQL in the same order,
// driven by the schema version 26.7 reports.
func (en *engines) migrate26(t *testing.T) []int {
	t.Helper()
	en.e.Exec(t, analytics.MigrateSetupSQL(en.db)...)
	out, err := en.e.Query(analytics.SchemaVersionSQL(en.db), "")
	if err != nil {
		t.Fatalf("26.7: %v", err)
	}
	var current int
	if _, err := fmt.Sscan(out, &current); err != nil {
		t.Fatalf("26.7 schema version %q: %v", out, err)
	}
	var applied []int
	for _, m := range analytics.Migrations {
		if m.Version <= current {
			continue
		}
		for i, q := range m.SQL(en.db) {
			if _, err := en.e.Query(q, ""); err != nil {
				t.Fatalf("26.7 refuses statement %d of migration %d (%s): %.1500v\nin:\n%.3000s", i+1, m.Version, m.Name, err, q)
			}
		}
		applied = append(applied, m.Version)
	}
	return applied
}

// copyTo26 loads 26.7 with 18.16's rows of the tables the product writes,
// by INSERTs into them as the store does (so the views fire there), as
// text.
func (en *engines) copyTo26(t *testing.T) {
	t.Helper()
	for table, cols := range map[string]string{
		"events":       analytics.EventColumns,
		"dead_letters": "received_date, received_at, received_us, cluster, source, reason, raw, raw_hash",
	} {
		rows, err := en.ch.QueryText(t, "", "SELECT "+cols+" FROM "+en.db+"."+table, "TabSeparated")
		if err != nil {
			t.Fatal(err)
		}
		if rows == "" {
			continue
		}
		en.e.Exec(t, "INSERT INTO "+en.db+"."+table+" ("+cols+") FORMAT TabSeparated\n"+rows)
	}
}

// recorded returns the statements the store sent to 18.16 since the last
// call, in the order they finished, named prefix #n.
func (en *engines) recorded(t *testing.T, prefix string) []engineStatement {
	t.Helper()
	type entry struct {
		QueryID string `json:"query_id"`
		Query   string `json:"query"`
		Type    int    `json:"type"`
	}
	var done []entry
	// A query is logged as started before the client sees an answer, and
	// as finished (2) or failed (3, 4) about when the client is done: read
	// until every started query has ended.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := en.ch.QueryText(t, "", "SYSTEM FLUSH LOGS", ""); err != nil {
			t.Fatal(err)
		}
		out, err := en.ch.QueryText(t, "", `SELECT query_id, query, type FROM system.query_log
			WHERE interface = 1 AND position(query, '`+en.db+`') > 0
			ORDER BY event_time, query_start_time`, "JSONEachRow")
		if err != nil {
			t.Fatal(err)
		}
		started, ended := map[string]bool{}, map[string]bool{}
		done = done[:0]
		for line := range strings.Lines(out) {
			var r entry
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("query log row %q: %v", line, err)
			}
			if r.Type == 1 {
				started[r.QueryID] = true
				continue
			}
			ended[r.QueryID] = true
			if r.Type == 2 {
				done = append(done, r)
			}
		}
		if len(started) == len(ended) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("18.16 logged %d queries as started and %d as ended after 30 s", len(started), len(ended))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var stmts []engineStatement
	for _, r := range done {
		if en.seen[r.QueryID] {
			continue
		}
		en.seen[r.QueryID] = true
		stmts = append(stmts, engineStatement{name: fmt.Sprintf("%s #%d", prefix, len(stmts)+1), sql: r.Query})
	}
	return stmts
}

// selects keeps the SELECT statements.
func selects(stmts []engineStatement) []engineStatement {
	return slices.DeleteFunc(slices.Clone(stmts), func(s engineStatement) bool {
		return !strings.HasPrefix(strings.TrimSpace(strings.ToUpper(s.sql)), "SELECT")
	})
}

// sameAnswers runs each statement on both engines (in one HTTP session on
// 18.16, so that temporary tables work as on chDB's connection) and
// requires equal column types and rows. It returns how many rows the
// answers held, so that callers can tell a comparison of nothing.
func (en *engines) sameAnswers(t *testing.T, session string, stmts []engineStatement) int {
	t.Helper()
	const format = "TabSeparatedWithNamesAndTypes"
	rows := 0
	for _, s := range stmts {
		old, err := en.ch.QueryText(t, session, s.sql, format)
		if err != nil {
			t.Errorf("%s: 18.16: %.1500v\nin:\n%.3000s", s.name, err, s.sql)
			continue
		}
		cur, err := en.e.Query(s.sql, format)
		if err != nil {
			t.Errorf("%s: 26.7: %.1500v\nin:\n%.3000s", s.name, err, s.sql)
			continue
		}
		old, cur = zeroTime.Replace(withoutNames(old)), withoutNames(cur)
		if s.norm != nil {
			old, cur = s.norm(old), s.norm(cur)
		}
		if old != cur {
			t.Errorf("%s: the engines differ\n%s\nin:\n%.3000s", s.name, lineDiff(old, cur), s.sql)
		}
		rows += max(strings.Count(old, "\n")-1, 0)
	}
	return rows
}

// zeroTime: 18.16 prints the zero DateTime and Date as 0000-00-00, 26.7
// as 1970-01-01. The value is the same (0), and so is what the driver
// scans (time.Unix(0, 0)).
var zeroTime = strings.NewReplacer("0000-00-00 00:00:00", "1970-01-01 00:00:00", "0000-00-00", "1970-01-01")

// unordered sorts the rows of an answer whose statement has no ORDER BY:
// its reader takes the rows as a set.
func unordered(tsv string) string {
	types, rows, _ := strings.Cut(tsv, "\n")
	lines := strings.SplitAfter(rows, "\n")
	slices.Sort(lines)
	return types + "\n" + strings.Join(lines, "")
}

func withoutNames(tsv string) string {
	_, rest, _ := strings.Cut(tsv, "\n")
	return rest
}

// lineDiff shows the first line where 18.16 and 26.7 differ, with a few
// lines around it.
func lineDiff(old, cur string) string {
	a, b := strings.Split(old, "\n"), strings.Split(cur, "\n")
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	show := func(l []string) string {
		return strings.Join(l[max(i-2, 0):min(i+3, len(l))], "\n")
	}
	return fmt.Sprintf("(line %d; 18.16 %d lines, 26.7 %d lines)\n18.16:\n%s\n26.7:\n%s", i, len(a), len(b), show(a), show(b))
}

// tableStatements read every table of the database in full, deduplicated
// as the engine would merge it (FINAL), in a total order: the tables of
// the migrations, and those the views fill on each engine from its own
// INSERTs. Views hold no rows; their definitions ran on both already.
func (en *engines) tableStatements(t *testing.T) []engineStatement {
	t.Helper()
	out, err := en.ch.QueryText(t, "", "SELECT name, engine FROM system.tables WHERE database = '"+en.db+
		"' AND engine NOT LIKE '%View' ORDER BY name", "TabSeparated")
	if err != nil {
		t.Fatal(err)
	}
	var stmts []engineStatement
	for line := range strings.Lines(out) {
		table, engine, _ := strings.Cut(strings.TrimSpace(line), "\t")
		cols, err := en.ch.QueryText(t, "", "SELECT name FROM system.columns WHERE database = '"+en.db+"' AND table = '"+table+"'", "TabSeparated")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for c := range strings.Lines(cols) {
			// applied_at is when each engine applied the migration.
			if c = strings.TrimSpace(c); !(table == "schema_migrations" && c == "applied_at") {
				names = append(names, c)
			}
		}
		final := ""
		if engine != "MergeTree" {
			final = " FINAL"
		}
		list := strings.Join(names, ", ")
		stmts = append(stmts, engineStatement{name: "table " + table,
			sql: "SELECT " + list + " FROM " + en.db + "." + table + final + " ORDER BY " + list})
	}
	return stmts
}

// schemaStatements compare what the migrations built: tables, their
// engines and sorting keys, and the columns with their types.
func (en *engines) schemaStatements() []engineStatement {
	return []engineStatement{
		{name: "schema: tables", sql: "SELECT name, engine FROM system.tables WHERE database = '" + en.db + "' ORDER BY name"},
		{name: "schema: columns", sql: "SELECT table, name, type FROM system.columns WHERE database = '" + en.db + "' ORDER BY table, name"},
		{name: "schema: applied migrations", sql: "SELECT version, name FROM " + en.db + ".schema_migrations ORDER BY version"},
	}
}

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
func engineRows() []analytics.Row {
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

	en := newEngines(t, ch, e)
	if n := en.sameAnswers(t, "", en.schemaStatements()); n < len(analytics.Migrations) {
		t.Fatalf("the schema comparison saw %d rows", n)
	}
	t.Run("migrating twice applies nothing", func(t *testing.T) {
		if again, err := en.store.Migrate(ctx); err != nil || len(again) != 0 {
			t.Errorf("18.16: applied %v, %v", again, err)
		}
		if again := en.migrate26(t); len(again) != 0 {
			t.Errorf("26.7: applied %v", again)
		}
		en.sameAnswers(t, "", en.schemaStatements())
	})

	// 18.16 is written through the product's writer path, in batches
	// that repeat rows (the store drops what it stored before).
	rows := engineRows()
	dead := []analytics.DeadLetter{{Cluster: "c1", Source: "webhook", Reason: "not JSON", Raw: "{\"kind\":", ReceivedAt: t0.UnixMicro()}}
	for i := 0; i < len(rows); i += 1000 {
		batch := rows[max(i-100, 0):min(i+1000, len(rows))]
		if _, err := en.store.Insert(ctx, batch, dead[:min(i, 1)]); err != nil {
			t.Fatal(err)
		}
	}
	en.recorded(t, "load") // the loading statements; the lookups follow

	// The writer's stored-keys lookup, for a batch half stored before:
	// its keys travel as the external table batch_keys, which on 26.7
	// (and on 18.16 over HTTP) is a temporary table of the session.
	batch := append(slices.Clone(rows[:20]), func() []analytics.Row {
		s := &scenario{n: 200_000}
		for i := range 5 {
			s.add(time.Duration(i)*time.Minute, "late", "update", "", "configmaps", "ns-1", "obj-9", 200, nil)
		}
		return s.rows
	}()...)
	if res, err := en.store.Insert(ctx, batch, nil); err != nil || res.Stored != 5 {
		t.Fatalf("insert a half-stored batch: %+v, %v", res, err)
	}
	var lookups []engineStatement
	for _, s := range selects(en.recorded(t, "stored-keys lookup")) {
		if strings.Contains(s.sql, "batch_keys") {
			s.norm = unordered // the store takes the keys as a set
			lookups = append(lookups, s)
		}
	}
	if len(lookups) == 0 {
		t.Fatal("the store's insert ran no lookup that reads batch_keys: the suite must learn the new lookup")
	}
	en.copyTo26(t)

	t.Run("tables", func(t *testing.T) {
		if n := en.sameAnswers(t, "", en.tableStatements(t)); n < len(rows) {
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
		session := "lookup-" + en.db
		for _, q := range setup {
			if _, err := ch.QueryText(t, session, q, ""); err != nil {
				t.Fatal(err)
			}
		}
		e.Exec(t, setup...)
		defer func() { _, _ = e.Query("DROP TEMPORARY TABLE IF EXISTS batch_keys", "") }()
		if n := en.sameAnswers(t, session, lookups); n < len(batch) {
			t.Errorf("the lookups found %d stored keys, want all %d of the batch", n, len(batch))
		}
	})

	shapes := reportShapes(en.db)
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		t.Run("report: "+name, func(t *testing.T) {
			if _, err := Build(ctx, en.store.Conn(), shapes[name]); err != nil {
				t.Fatalf("18.16: %v", err)
			}
			stmts := en.recorded(t, name)
			if len(stmts) < len(All) {
				t.Fatalf("the report ran %d statements, fewer than the %d of All", len(stmts), len(All))
			}
			if n := en.sameAnswers(t, "", stmts); n == 0 {
				t.Error("every answer was empty")
			}
		})
	}

	t.Run("an empty database says no requests on both", func(t *testing.T) {
		empty := newEngines(t, ch, e)
		o := reportShapes(empty.db)["rollup with edges"]
		if _, err := Build(ctx, empty.store.Conn(), o); !errors.Is(err, ErrNoEvents) {
			t.Fatalf("18.16: %v, want ErrNoEvents", err)
		}
		stmts := empty.recorded(t, "empty")
		empty.sameAnswers(t, "", append(stmts, empty.tableStatements(t)...))
		totals := slices.IndexFunc(stmts, func(s engineStatement) bool { return strings.Contains(s.sql, "sum(requests)") })
		if totals < 0 {
			t.Fatal("no totals statement among the report's")
		}
		if out, err := e.Query(stmts[totals].sql, "TabSeparated"); err != nil || !strings.HasPrefix(out, "0\t") {
			t.Errorf("26.7 totals on an empty database: %q, %v; want 0 requests", out, err)
		}
	})

	// Last: it drops partitions. A cutoff before every row drops nothing
	// and shows the listing; then two days go on 18.16, and the same
	// ALTERs on 26.7 must leave the same tables.
	t.Run("retention", func(t *testing.T) {
		if days, err := en.store.DropPartitionsBefore(ctx, t0.Add(-30*24*time.Hour)); err != nil || len(days) != 0 {
			t.Fatalf("18.16 dropped %v, %v before every row", days, err)
		}
		listings := selects(en.recorded(t, "retention listing"))
		for i := range listings {
			// 18.16 shows a Date partition as 2026-11-29, 26.7 as
			// '2026-11-29'; the store reads both. The listing has no order.
			listings[i].norm = func(s string) string { return unordered(partitionQuotes.ReplaceAllString(s, "$1")) }
		}
		if len(listings) == 0 {
			t.Fatal("retention listed no partitions")
		}
		if n := en.sameAnswers(t, "", listings); n == 0 {
			t.Error("the listings were empty")
		}
		days, err := en.store.DropPartitionsBefore(ctx, t0.Truncate(24*time.Hour))
		if err != nil || len(days) != 2 {
			t.Fatalf("18.16 dropped %v, %v; want the two days before", days, err)
		}
		for _, s := range en.recorded(t, "retention") {
			if strings.HasPrefix(s.sql, "ALTER") {
				e.Exec(t, s.sql)
			}
		}
		en.sameAnswers(t, "", en.tableStatements(t))
	})
}
