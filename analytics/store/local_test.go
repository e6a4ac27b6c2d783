package store

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/testenv"
)

func TestBindNamed(t *testing.T) {
	args := []any{clickhouse.Named("s", `it's a \ path`), clickhouse.Named("n", uint64(18446744073709551615)),
		clickhouse.Named("i", -3), clickhouse.Named("b", true), clickhouse.Named("f", 0.25)}
	for _, c := range []struct{ in, want, err string }{
		{"SELECT @s, @n, @i, @b, @f", `SELECT 'it\'s a \\ path', 18446744073709551615, -3, 1, 0.25`, ""},
		{"SELECT '@s', `@s`, \"@s\" -- @s\n, @n /* @s /* @s */ @s */ # @s", "SELECT '@s', `@s`, \"@s\" -- @s\n, 18446744073709551615 /* @s /* @s */ @s */ # @s", ""},
		{`SELECT 'a\'@s', 'b''@s', @n`, `SELECT 'a\'@s', 'b''@s', 18446744073709551615`, ""},
		{"SELECT @nope", "", `have no arg for "@nope" param`},
		{"SELECT a@x.c, @", "", `have no arg for "@x" param`},
	} {
		got, err := bindNamed(c.in, args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("bindNamed(%q) = %q, %v; want the error %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("bindNamed(%q)\n = %q, %v\nwant %q", c.in, got, err, c.want)
		}
	}
	if _, err := bindNamed("SELECT ?", []any{1}); err == nil {
		t.Error("a positional argument was bound")
	}
	if _, err := bindNamed("SELECT @t", []any{clickhouse.Named("t", time.Now())}); err == nil {
		t.Error("a time was bound without a stated literal")
	}
}

// TestLocalStoreAnswersAsTheServer stores the same events through the
// store on a server (18.16, the native protocol) and on the engine in
// this process (26.7, Native blocks), and requires the same Go values
// from the same queries: the events, their field histories and the
// schema version.
func TestLocalStoreAnswersAsTheServer(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and loads ClickHouse 26.7 (chDB)")
	server, _ := newStore(t, true)
	e := chdbtest.Open(t)
	local, err := OpenLocal(e.Engine, Options{Database: e.NewDatabase(t), KeepRaw: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.Migrate(t.Context()); err != nil {
		t.Fatalf("migrate on the engine: %v", err)
	}
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	for _, st := range []*Store{server, local} {
		if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		AuditID, Writer, Verb, Stamp, Raw string
		Code                              uint16
		Causes, Groups                    []string
		Us                                uint64
		Time, Day                         time.Time
		Unix, DayUnix                     int64 // of Time and Day: their Location pointers differ
	}
	read := func(st *Store) []answer {
		t.Helper()
		rs, err := st.conn.Query(t.Context(), `SELECT audit_id, writer, verb, stamp, raw, code, cause_reasons, user_groups, event_time_us, event_time, event_date
			FROM `+st.db+`.events_by_hour WHERE cluster = @cluster ORDER BY audit_id, stage`, clickhouse.Named("cluster", "prod"))
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var out []answer
		for rs.Next() {
			var a answer
			if err := rs.Scan(&a.AuditID, &a.Writer, &a.Verb, &a.Stamp, &a.Raw, &a.Code, &a.Causes, &a.Groups, &a.Us, &a.Time, &a.Day); err != nil {
				t.Fatal(err)
			}
			a.Unix, a.DayUnix, a.Time, a.Day = a.Time.Unix(), a.Day.Unix(), time.Time{}, time.Time{}
			out = append(out, a)
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want, got := read(server), read(local)
	if len(want) != len(rows) {
		t.Fatalf("the server holds %d events, want %d", len(want), len(rows))
	}
	for i := range want {
		if i >= len(got) || !reflect.DeepEqual(got[i], want[i]) {
			var g answer
			if i < len(got) {
				g = got[i]
			}
			g.Raw, want[i].Raw = fmt.Sprintf("%d bytes", len(g.Raw)), fmt.Sprintf("%d bytes", len(want[i].Raw))
			t.Fatalf("row %d: the engine answers\n%+v\nthe server\n%+v", i, g, want[i])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("the engine answers %d rows, the server %d", len(got), len(want))
	}
	var hw, hl []any
	for _, h := range []struct {
		st  *Store
		dst *[]any
	}{{server, &hw}, {local, &hl}} {
		var n, versions uint64
		var paths []string
		if err := h.st.conn.QueryRow(t.Context(), "SELECT count(), sum(object_version), arraySort(groupUniqArrayArray(field_paths)) FROM "+h.st.db+".field_versions").Scan(&n, &versions, &paths); err != nil {
			t.Fatal(err)
		}
		*h.dst = []any{n, versions, paths}
	}
	if !reflect.DeepEqual(hl, hw) || hw[0].(uint64) == 0 {
		t.Fatalf("field histories: engine %v, server %v (want equal, and some)", hl, hw)
	}
	if v, err := local.SchemaVersion(t.Context()); err != nil || v == 0 {
		t.Fatalf("schema version on the engine: %d, %v", v, err)
	}
	if err := local.conn.QueryRow(t.Context(), "SELECT 1 WHERE 0").Scan(new(uint8)); err == nil {
		t.Fatal("QueryRow of no row scanned")
	}
	if _, err := local.conn.Query(t.Context(), "SELECT nosuchfunction(1)"); err == nil || !strings.Contains(err.Error(), "Code: 46") {
		t.Fatalf("an unknown function: %v, want ClickHouse's Code 46", err)
	}
}

// FuzzBindNamedOnTheEngine binds any string as the product binds a
// filter (--namespace, --user, --resource) and requires the engine to
// read back exactly that string: no value, however quoted, escapes its
// literal. The seeds run in every `go test`; `go test -fuzz` explores.
func FuzzBindNamedOnTheEngine(f *testing.F) {
	for _, s := range []string{"", "team-a", `x' OR 1=1 --`, `\`, `\'`, "''", "a\x00b", "@s", "?", "-- c\n", "/* c */", "é\xff\xfe", "\t\r\n", "`q`", `"q"`} {
		f.Add(s, int64(-1))
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		testenv.SkipIfShort(t, "loads ClickHouse 26.7 (chDB)")
		local, err := OpenLocal(chdbtest.Open(t).Engine, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		var gotN int64
		if err := local.conn.QueryRow(t.Context(), "SELECT @s AS s, toInt64(@n) AS n /* @s */", clickhouse.Named("s", s), clickhouse.Named("n", n)).Scan(&got, &gotN); err != nil {
			t.Fatalf("bind %q, %d: %v", s, n, err)
		}
		if got != s || gotN != n {
			t.Fatalf("bound %q, %d; the engine read %q, %d", s, n, got, gotN)
		}
	})
}
