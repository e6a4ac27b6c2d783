package dashboards_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
)

// TestVariablesCannotInjectSQL runs every dashboard query on ClickHouse
// 18.16 with hostile variable values, expanded as Grafana expands them: a
// value that ends in a backslash (which Grafana's singlequote format left
// free to escape the closing quote) selects nothing and is no syntax
// error, and a writer DOMAIN\user is matched. The same run proves the
// verb, code and hide_system variables: the hour is compacted, so the
// totals read the hour caches (which the toggle narrows, and verb and code
// do not) and the audit events table reads events (which all three
// narrow).
func TestVariablesCannotInjectSQL(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	srv := chtest.Start(t)
	ctx := t.Context()
	st := migrated(t, srv)
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	ev := &events{cluster: "c"}
	for i := range 3 {
		ev.add(t0.Add(time.Duration(i)*time.Minute), `DOMAIN\user`, "configmaps", "", "shop", "a", 200, nil)
	}
	for i := range 2 {
		ev.add(t0.Add(time.Duration(i)*time.Minute+time.Second), "alice", "configmaps", "", "shop", "b'c", 409, nil)
	}
	// Kubernetes' own writers (hidden by hide_system), and an operator's
	// service account (not).
	ev.add(t0.Add(3*time.Minute), "system:kube-controller-manager", "configmaps", "", "kube-system", "x", 200, nil)
	ev.add(t0.Add(3*time.Minute+time.Second), "system:serviceaccount:kube-system:replicaset-controller", "configmaps", "", "kube-system", "y", 200,
		func(r *audit.Row) { r.Verb = "patch" })
	ev.add(t0.Add(3*time.Minute+2*time.Second), "system:serviceaccount:shop:operator", "configmaps", "", "shop", "d", 201,
		func(r *audit.Row) { r.Verb = "create" })
	if _, err := st.InsertRecords(ctx, recordtest.Set(ev.rows, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Compact(ctx, time.Unix(0, 0), 0); err != nil {
		t.Fatal(err)
	}
	gen, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const hostile = `=name) OR (1=1) --\`
	cases := []struct {
		name string
		vars map[string][]string
		// requests are the totals' (from the hour caches), events the
		// audit events table's rows (from events).
		requests, events string
	}{
		{"everything", nil, "8", "8"},
		{"a hostile cluster", map[string][]string{"cluster": {hostile}}, "0", "0"},
		{"a hostile name", map[string][]string{"name": {hostile}}, "0", "0"},
		{"a hostile writer", map[string][]string{"user": {hostile}}, "0", "0"},
		{"a hostile writer among others", map[string][]string{"user": {"nobody", hostile}}, "0", "0"},
		{`DOMAIN\user`, map[string][]string{"user": {`DOMAIN\user`}}, "3", "3"},
		{`DOMAIN\user and alice`, map[string][]string{"user": {`DOMAIN\user`, "alice"}}, "5", "5"},
		{"a name with a quote", map[string][]string{"name": {"b'c"}}, "2", "2"},
		{"Kubernetes' own writers hidden", map[string][]string{"hide_system": {"yes"}}, "6", "6"},
		{"a hostile toggle", map[string][]string{"hide_system": {hostile}}, "8", "8"},
		{"one verb", map[string][]string{"verb": {"patch"}}, "8", "1"},
		{"two verbs", map[string][]string{"verb": {"create", "patch"}}, "8", "2"},
		{"one code", map[string][]string{"code": {"409"}}, "8", "2"},
		{"a verb and a code", map[string][]string{"verb": {"update"}, "code": {"200"}}, "8", "4"},
		{"a hostile verb", map[string][]string{"verb": {hostile}}, "8", "0"},
		{"a hostile verb among others", map[string][]string{"verb": {"update", hostile}}, "8", "6"},
		{"a hostile code", map[string][]string{"code": {hostile}}, "8", "0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vars := map[string][]string{"cluster": {"c"}, "name": {""}, "hide_system": {"no"}}
			all := map[string]bool{}
			for k, v := range c.vars {
				vars[k] = v
			}
			for _, k := range []string{"namespace", "resource", "user", "verb", "code"} {
				if _, ok := vars[k]; !ok {
					all[k] = true
				}
			}
			sqls, err := gen.Expanded(asql.Expansion{From: t0.Add(-time.Hour), To: t0.Add(time.Hour), Interval: time.Minute, Vars: vars, All: all})
			if err != nil {
				t.Fatal(err)
			}
			totals, raw := 0, 0
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
				narrowed := slices.Contains(q.Statement.Params, asql.Verb)
				switch {
				case q.Statement.Name == asql.Totals.Name:
					totals++
					if len(lines) != 2 || strings.Split(lines[1], "\t")[0] != c.requests {
						t.Errorf("%s: %q, want %s requests", q.Name, out, c.requests)
					}
				case q.Statement.Name == asql.RawEvents.Name:
					raw++
					if got := len(lines) - 1; strings.TrimSpace(out) == "" || fmt.Sprint(got) != c.events {
						t.Errorf("%s: %d events, want %s:\n%s", q.Name, got, c.events, out)
					}
				case (c.requests == "0" || (c.events == "0" && narrowed)) && q.Shape != asql.Number && len(lines) > 1 && !strings.Contains(q.Name, "/var/"):
					t.Errorf("%s selects rows: %q", q.Name, out)
				}
			}
			if totals == 0 || raw == 0 {
				t.Errorf("%d panels read the totals, %d the audit events", totals, raw)
			}
		})
	}
}
