package dashboards_test

import (
	"strings"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
)

// TestVariablesCannotInjectSQL runs every dashboard query on ClickHouse
// 18.16 with hostile variable values, expanded as Grafana expands them: a
// value that ends in a backslash (which Grafana's singlequote format left
// free to escape the closing quote) selects nothing and is no syntax
// error, and a writer DOMAIN\user is matched.
func TestVariablesCannotInjectSQL(t *testing.T) {
	srv := chtest.Start(t)
	ctx := t.Context()
	st, err := store.Open(ctx, store.Options{DSN: srv.DSN(), Database: "stampguard"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	ev := &events{cluster: "c"}
	for i := range 3 {
		ev.add(t0.Add(time.Duration(i)*time.Minute), `DOMAIN\user`, "configmaps", "", "shop", "a", 200, nil)
	}
	for i := range 2 {
		ev.add(t0.Add(time.Duration(i)*time.Minute+time.Second), "alice", "configmaps", "", "shop", "b'c", 409, nil)
	}
	if _, err := st.InsertRecords(ctx, recordtest.Set(ev.rows, nil)); err != nil {
		t.Fatal(err)
	}
	gen, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const hostile = `=name) OR (1=1) --\`
	all := map[string]bool{"namespace": true, "resource": true, "user": true}
	cases := []struct {
		name     string
		vars     map[string][]string
		all      map[string]bool
		requests string
	}{
		{"everything", map[string][]string{"cluster": {"c"}, "name": {""}}, all, "5"},
		{"a hostile cluster", map[string][]string{"cluster": {hostile}, "name": {""}}, all, "0"},
		{"a hostile name", map[string][]string{"cluster": {"c"}, "name": {hostile}}, all, "0"},
		{"a hostile writer", map[string][]string{"cluster": {"c"}, "name": {""}, "user": {hostile}}, map[string]bool{"namespace": true, "resource": true}, "0"},
		{"a hostile writer among others", map[string][]string{"cluster": {"c"}, "name": {""}, "user": {"nobody", hostile}}, map[string]bool{"namespace": true, "resource": true}, "0"},
		{`DOMAIN\user`, map[string][]string{"cluster": {"c"}, "name": {""}, "user": {`DOMAIN\user`}}, map[string]bool{"namespace": true, "resource": true}, "3"},
		{`DOMAIN\user and alice`, map[string][]string{"cluster": {"c"}, "name": {""}, "user": {`DOMAIN\user`, "alice"}}, map[string]bool{"namespace": true, "resource": true}, "5"},
		{"a name with a quote", map[string][]string{"cluster": {"c"}, "name": {"b'c"}}, all, "2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sqls, err := gen.Expanded(asql.Expansion{From: t0.Add(-time.Hour), To: t0.Add(time.Hour), Interval: time.Minute, Vars: c.vars, All: c.all})
			if err != nil {
				t.Fatal(err)
			}
			totals := 0
			for _, q := range gen.Queries {
				if q.Alert {
					continue
				}
				out, err := srv.QueryText(t, "", sqls[q.Name], "TabSeparatedWithNames")
				if err != nil {
					t.Errorf("%s: %v", q.Name, err)
					continue
				}
				lines := strings.Split(strings.TrimSpace(out), "\n")
				switch {
				case q.Statement.Name == asql.Totals.Name:
					totals++
					if len(lines) != 2 || strings.Split(lines[1], "\t")[0] != c.requests {
						t.Errorf("%s: %q, want %s requests", q.Name, out, c.requests)
					}
				case c.requests == "0" && q.Shape != asql.Number && len(lines) > 1 && !strings.Contains(q.Name, "/var/"):
					t.Errorf("%s selects rows: %q", q.Name, out)
				}
			}
			if totals == 0 {
				t.Error("no panel reads the totals")
			}
		})
	}
}
