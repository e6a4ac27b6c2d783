// Package enginetest proves SQL on two ClickHouse engines at once: 18.16
// (a real server, test/chtest, written and read through the
// product's Store and driver) and 26.7 (chDB in the test process,
// test/chdbtest, which has no native protocol). A Pair is one
// database on both; SameAnswers runs statements on both and compares
// their answers byte for byte: column types and rows as
// TabSeparatedWithNamesAndTypes, without the names (ClickHouse names
// unaliased expressions after their text).
//
// The statements need not be rendered by hand: what the product sends to
// 18.16 through Pair.Store (or any native client with log_queries = 1)
// lands in 18.16's query log with the driver's bound parameters, and
// Recorded returns it. Statements of other origins (dashboard panels
// expanded as the plugin expands them, say) are a []Statement.
//
// Only tests import this package. A test binary that uses it runs its
// tests through chdbtest.Main.
package enginetest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
)

// Statement is one statement run on both engines.
type Statement struct {
	Name, SQL string
	// Norm, when set, rewrites both answers before they are compared, for
	// a difference the product reads through (say so where it is set).
	Norm func(string) string
}

// Pair is one database on both engines.
type Pair struct {
	CH    *chtest.Server
	E     *chdbtest.Engine
	DB    string
	Store *store.Store    // on 18.16; its queries are logged
	seen  map[string]bool // query ids already taken from the log
	marks int             // markers sent (Recorded)
}

// New creates a database on both engines and migrates it: 18.16 with
// Store.Migrate, 26.7 with the same SQL (Migrate26), and requires both to
// apply the same migrations.
func New(t *testing.T, ch *chtest.Server, e *chdbtest.Engine) *Pair {
	t.Helper()
	db := ch.NewDatabase(t)
	st := loggedStore(t, ch, db)
	en := &Pair{CH: ch, E: e, DB: db, Store: st, seen: map[string]bool{}}
	applied, err := st.Migrate(t.Context())
	if err != nil {
		t.Fatalf("migrate 18.16: %v", err)
	}
	if got := en.Migrate26(t); !slices.Equal(got, applied) {
		t.Fatalf("migrations applied: 18.16 %v, 26.7 %v", applied, got)
	}
	t.Cleanup(func() { _, _ = e.Query("DROP DATABASE IF EXISTS "+db+" SYNC", "") })
	en.Recorded(t, "migrate") // proven above, statement by statement
	return en
}

// loggedStore opens a store on db whose queries go to the query log,
// where Recorded finds them (unknown DSN parameters become settings).
func loggedStore(t *testing.T, ch *chtest.Server, db string) *store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), store.Options{DSN: ch.DatabaseDSN(db) + "&log_queries=1", Database: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Attach pairs database db, which something else (auditsink ingest, say)
// created and migrated on 18.16, with the same database on 26.7, migrated
// there with Migrate26.
func Attach(t *testing.T, ch *chtest.Server, e *chdbtest.Engine, db string) *Pair {
	t.Helper()
	if err := asql.ValidDatabase(db); err != nil {
		t.Fatal(err)
	}
	en := &Pair{CH: ch, E: e, DB: db, Store: loggedStore(t, ch, db), seen: map[string]bool{}}
	en.Migrate26(t)
	t.Cleanup(func() { _, _ = e.Query("DROP DATABASE IF EXISTS "+db+" SYNC", "") })
	en.Recorded(t, "before")
	return en
}

// Migrate26 is Store.Migrate on 26.7: the same SQL in the same order,
// driven by the schema version 26.7 reports. It returns the versions it
// applied; a statement 26.7 refuses fails the test.
func (en *Pair) Migrate26(t *testing.T) []int {
	t.Helper()
	en.E.Exec(t, store.MigrateSetupSQL(en.DB)...)
	out, err := en.E.Query(store.SchemaVersionSQL(en.DB), "")
	if err != nil {
		t.Fatalf("26.7: %v", err)
	}
	var current int
	if _, err := fmt.Sscan(out, &current); err != nil {
		t.Fatalf("26.7 schema version %q: %v", out, err)
	}
	var applied []int
	for _, m := range store.Migrations {
		if m.Version <= current {
			continue
		}
		for i, q := range m.SQL(en.DB) {
			if _, err := en.E.Query(q, ""); err != nil {
				t.Fatalf("26.7 refuses statement %d of migration %d (%s): %.1500v\nin:\n%.3000s", i+1, m.Version, m.Name, err, q)
			}
		}
		applied = append(applied, m.Version)
	}
	return applied
}

// CopyTo26 loads 26.7 with 18.16's rows of the tables the product writes
// itself (events, dead_letters, ...), by INSERTs into them as the store
// does, so that 26.7's views fill their tables from them. The tables that
// views, the migrations or a compaction fill are left to each engine,
// except hour_marks: a mark hashes the events of one inserted block, and
// the copy's blocks are not the writers', so 18.16's marks replace those
// the copy made on 26.7.
func (en *Pair) CopyTo26(t *testing.T) {
	t.Helper()
	out, err := en.CH.QueryText(t, "", "SELECT name, engine, create_table_query FROM system.tables WHERE database = '"+en.DB+"' ORDER BY name", "JSONEachRow")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	filled := map[string]bool{"schema_migrations": true}
	for _, table := range CompactedTables {
		filled[table] = true
	}
	for _, m := range store.Migrations {
		for _, q := range m.Statements {
			for _, sub := range migrationInsert.FindAllStringSubmatch(q, -1) {
				filled[sub[1]] = true
			}
		}
	}
	viewTarget := regexp.MustCompile(`\bTO\s+` + en.DB + `\.(\w+)`)
	for line := range strings.Lines(out) {
		var r struct {
			Name   string `json:"name"`
			Engine string `json:"engine"`
			Create string `json:"create_table_query"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(r.Engine, "View") {
			for _, sub := range viewTarget.FindAllStringSubmatch(r.Create, -1) {
				filled[sub[1]] = true
			}
			continue
		}
		tables = append(tables, r.Name)
	}
	copied := 0
	for _, name := range tables {
		if filled[name] {
			continue
		}
		cols, err := en.CH.QueryText(t, "", "SELECT name FROM system.columns WHERE database = '"+en.DB+"' AND table = '"+name+
			"' AND default_kind NOT IN ('MATERIALIZED', 'ALIAS')", "TabSeparated")
		if err != nil {
			t.Fatal(err)
		}
		list := strings.Join(strings.Fields(cols), ", ")
		rows, err := en.CH.QueryText(t, "", "SELECT "+list+" FROM "+en.DB+"."+name, "TabSeparated")
		if err != nil {
			t.Fatal(err)
		}
		copied++
		if rows != "" {
			en.E.Exec(t, "INSERT INTO "+en.DB+"."+name+" ("+list+") FORMAT TabSeparated\n"+rows)
		}
	}
	if copied == 0 {
		t.Fatal("no table to copy: every table is filled by a view or a migration")
	}
	marks, err := en.CH.QueryText(t, "", "SELECT event_date, hour, mark FROM "+en.DB+".hour_marks", "TabSeparated")
	if err != nil {
		t.Fatal(err)
	}
	en.E.Exec(t, "TRUNCATE TABLE "+en.DB+".hour_marks")
	if marks != "" {
		en.E.Exec(t, "INSERT INTO "+en.DB+".hour_marks (event_date, hour, mark) FORMAT TabSeparated\n"+marks)
	}
}

// CompactedTables are the tables a compaction fills (analytics/sql,
// hours.go and history_blocks.go: the inserts and the records of its
// hours and its blocks); a test replays the compaction's statements on
// 26.7.
var CompactedTables = slices.Concat(asql.CacheTables, []string{migrationInsert.FindStringSubmatch(asql.CompactionRecord)[1]},
	asql.BlockTables, []string{migrationInsert.FindStringSubmatch(asql.BuildBlock([]asql.CleanHour{{}}).Record)[1]})

// migrationInsert finds the tables a migration statement fills.
var migrationInsert = regexp.MustCompile(`INSERT INTO \{db\}\.(\w+)`)

// Recorded returns the statements that native clients with log_queries =
// 1 (Store, say) sent to 18.16 about this database since the last call,
// in the order they finished, named prefix #n.
func (en *Pair) Recorded(t *testing.T, prefix string) []Statement {
	t.Helper()
	// The log is written by a background thread, in the order queries
	// were queued: once a marker sent now shows as finished, every query
	// that started before it shows too. Those that started must also have
	// ended (a query is logged as finished about when its client is done).
	en.marks++
	mark := fmt.Sprintf("SELECT 'enginetest mark %s %d'", en.DB, en.marks)
	if err := en.Store.Conn().Exec(t.Context(), mark); err != nil {
		t.Fatalf("18.16: %v", err)
	}
	type entry struct {
		QueryID string `json:"query_id"`
		Query   string `json:"query"`
		Type    int    `json:"type"`
	}
	var done []entry
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := en.CH.QueryText(t, "", "SYSTEM FLUSH LOGS", ""); err != nil {
			t.Fatal(err)
		}
		out, err := en.CH.QueryText(t, "", `SELECT query_id, query, type FROM system.query_log
			WHERE interface = 1 AND position(query, '`+en.DB+`') > 0
			ORDER BY event_time, query_start_time`, "JSONEachRow")
		if err != nil {
			t.Fatal(err)
		}
		started, ended := map[string]bool{}, map[string]bool{}
		marked := false
		done = done[:0]
		for line := range strings.Lines(out) {
			var r entry
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("query log row %q: %v", line, err)
			}
			if strings.HasPrefix(r.Query, "SELECT 'enginetest mark ") {
				marked = marked || (r.Query == mark && r.Type == 2)
				continue
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
		open := 0
		for id := range started {
			if !ended[id] {
				open++
			}
		}
		if marked && open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("18.16's query log after 30 s: marker shown %v, %d of %d started queries not ended", marked, open, len(started))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var stmts []Statement
	for _, r := range done {
		if en.seen[r.QueryID] {
			continue
		}
		en.seen[r.QueryID] = true
		stmts = append(stmts, Statement{Name: fmt.Sprintf("%s #%d", prefix, len(stmts)+1), SQL: r.Query})
	}
	return stmts
}

// Selects keeps the SELECT statements.
func Selects(stmts []Statement) []Statement {
	return slices.DeleteFunc(slices.Clone(stmts), func(s Statement) bool {
		return !strings.HasPrefix(strings.TrimSpace(strings.ToUpper(s.SQL)), "SELECT")
	})
}

// SameAnswers runs each statement on both engines (in one HTTP session on
// 18.16, so that temporary tables work as on chDB's connection) and
// requires equal column types and rows. It returns how many rows the
// answers held, so that callers can tell a comparison of nothing.
func (en *Pair) SameAnswers(t *testing.T, session string, stmts []Statement) int {
	t.Helper()
	const format = "TabSeparatedWithNamesAndTypes"
	rows := 0
	for _, s := range stmts {
		old, err := en.CH.QueryText(t, session, s.SQL, format)
		if err != nil {
			t.Errorf("%s: 18.16: %.1500v\nin:\n%.3000s", s.Name, err, s.SQL)
			continue
		}
		cur, err := en.E.Query(s.SQL, format)
		if err != nil {
			t.Errorf("%s: 26.7: %.1500v\nin:\n%.3000s", s.Name, err, s.SQL)
			continue
		}
		old, cur = zeroTime.Replace(withoutNames(old)), withoutNames(cur)
		if s.Norm != nil {
			old, cur = s.Norm(old), s.Norm(cur)
		}
		if old != cur {
			t.Errorf("%s: the engines differ\n%s\nin:\n%.3000s", s.Name, lineDiff(old, cur), s.SQL)
		}
		rows += max(strings.Count(old, "\n")-1, 0)
	}
	return rows
}

// zeroTime: 18.16 prints the zero DateTime and Date as 0000-00-00, 26.7
// as 1970-01-01. The value is the same (0), and so is what the driver
// scans (time.Unix(0, 0)).
var zeroTime = strings.NewReplacer("0000-00-00 00:00:00", "1970-01-01 00:00:00", "0000-00-00", "1970-01-01")

// Unordered sorts the rows of an answer whose statement has no ORDER BY:
// its reader takes the rows as a set.
func Unordered(tsv string) string {
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

// Tables reads every table of the database in full, deduplicated
// as the engine would merge it (FINAL), in a total order: the tables of
// the migrations, and those the views fill on each engine from its own
// INSERTs. Views hold no rows; their definitions ran on both already.
func (en *Pair) Tables(t *testing.T) []Statement {
	t.Helper()
	out, err := en.CH.QueryText(t, "", "SELECT name, engine FROM system.tables WHERE database = '"+en.DB+
		"' AND engine NOT LIKE '%View' ORDER BY name", "TabSeparated")
	if err != nil {
		t.Fatal(err)
	}
	var stmts []Statement
	for line := range strings.Lines(out) {
		table, engine, _ := strings.Cut(strings.TrimSpace(line), "\t")
		cols, err := en.CH.QueryText(t, "", "SELECT name FROM system.columns WHERE database = '"+en.DB+"' AND table = '"+table+"'", "TabSeparated")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for c := range strings.Lines(cols) {
			// applied_at and compacted_at are when each engine ran the
			// statement.
			if c = strings.TrimSpace(c); c != "applied_at" && c != "compacted_at" {
				names = append(names, c)
			}
		}
		final := ""
		if engine != "MergeTree" {
			final = " FINAL"
		}
		if table == "hour_marks" {
			// A mark hashes one inserted block; the engines cut an
			// INSERT SELECT into blocks of their own sizes.
			names = []string{"event_date", "hour"}
		}
		list := strings.Join(names, ", ")
		if table == "hour_marks" {
			stmts = append(stmts, Statement{Name: "table " + table,
				SQL: "SELECT DISTINCT " + list + " FROM " + en.DB + "." + table + " ORDER BY " + list})
			continue
		}
		stmts = append(stmts, Statement{Name: "table " + table,
			SQL: "SELECT " + list + " FROM " + en.DB + "." + table + final + " ORDER BY " + list})
	}
	return stmts
}

// Schema compares what the migrations built: tables with their engines,
// partition and sorting keys, and columns with their types.
func (en *Pair) Schema() []Statement {
	return []Statement{
		{Name: "schema: tables", SQL: "SELECT name, engine, partition_key, sorting_key, primary_key FROM system.tables WHERE database = '" + en.DB + "' ORDER BY name"},
		{Name: "schema: columns", SQL: "SELECT table, name, type FROM system.columns WHERE database = '" + en.DB + "' ORDER BY table, name"},
		{Name: "schema: applied migrations", SQL: "SELECT version, name FROM " + en.DB + ".schema_migrations ORDER BY version"},
	}
}
