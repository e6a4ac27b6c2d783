package dashboards_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

// TestCountSeriesDoNotChangeWithZoom runs every count series of the
// dashboards on ClickHouse 18.16 at a panel interval of 1m and of 2m (what
// Grafana picks as the range widens): each 2m bucket's value is the mean
// of its two 1m buckets' values, so the series is per second and a zoom
// does not change its level. Every time series is either such a count or
// one that does not scale with the bucket (a rate, a latency).
func TestCountSeriesDoNotChangeWithZoom(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	srv := chtest.Start(t)
	ctx := t.Context()
	st := migrated(t, srv)
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	ev := &events{cluster: "c"}
	// Over 20 minutes, a rate that varies minute by minute: updates (every
	// third a version conflict, every fifth stampless), expired lists, a
	// lease changing hands, and stampguard decisions.
	for m := range 20 {
		at := t0.Add(time.Duration(m) * time.Minute)
		for i := range 3 + m%4*5 {
			code := int32(200)
			if i%3 == 0 {
				code = 409
			}
			ev.add(at.Add(time.Duration(i)*time.Second), "operator", "configmaps", "", "shop", fmt.Sprintf("cm-%d", i%4), code, func(r *audit.Row) {
				if code == 200 && i%5 == 0 {
					r.Stamp = ""
				}
			})
		}
		if m%3 == 0 {
			ev.add(at.Add(30*time.Second), "watcher", "pods", "", "shop", "", 410, func(r *audit.Row) { r.Verb = "list" })
		}
		ev.add(at.Add(40*time.Second), []string{"node-a", "node-b"}[m%2], "leases", "coordination.k8s.io", "kube-system", "leader", 200,
			func(r *audit.Row) { r.LeaseHolder = []string{"node-a", "node-b"}[m%2] })
		action := []string{"Audit", "Deny"}[m%2]
		ev.add(at.Add(50*time.Second), "legacy-script", "configmaps", "", "shop", "settings", 200, func(r *audit.Row) {
			r.Stamp = ""
			r.AnnotationKeys = []string{"stamp.stampguard.dev/stamp-missing"}
			r.AnnotationValues = []string{`[{"policy":"shop","rule":"requireResourceVersion","action":"` + action + `","path":"metadata.resourceVersion","writer":"legacy-script"}]`}
		})
	}
	if _, err := st.InsertRecords(ctx, recordtest.Set(ev.rows, nil)); err != nil {
		t.Fatal(err)
	}
	gen, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The count series, with their label columns.
	counts := map[string][]string{
		asql.ConflictKindsSeries.Name: nil, asql.StamplessGoneSeries.Name: nil,
		asql.PolicyDecisionsSeries.Name: {"action"}, asql.LeaseChangesSeries.Name: {"lease"},
	}
	notCounts := map[string]bool{asql.ConflictRateSeries.Name: true, asql.WriteLatencySeries.Name: true}
	// series runs q at interval: value by "<bucket second>|<labels>|<column>".
	series := func(q dashboards.Query, interval time.Duration) map[string]float64 {
		t.Helper()
		sqls, err := gen.Expanded(asql.Expansion{From: t0.Add(-10 * time.Minute), To: t0.Add(30 * time.Minute), Interval: interval,
			Vars: map[string][]string{"cluster": {"c"}, "name": {""}, "hide_system": {"no"}},
			All:  map[string]bool{"namespace": true, "resource": true, "user": true, "verb": true, "code": true}})
		if err != nil {
			t.Fatal(err)
		}
		out, err := srv.QueryText(t, "", "SELECT toUInt32(time) AS bucket_s, * FROM ("+sqls[q.Name]+")", "TabSeparatedWithNames")
		if err != nil {
			t.Fatalf("%s: %v", q.Name, err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		cols := strings.Split(lines[0], "\t")
		values := map[string]float64{}
		for _, line := range lines[1:] {
			cells := strings.Split(line, "\t")
			var labels []string
			for i, c := range cols {
				for _, l := range counts[q.Statement.Name] {
					if c == l {
						labels = append(labels, cells[i])
					}
				}
			}
			for i, c := range cols {
				if c == "bucket_s" || c == "time" || strings.Contains(strings.Join(counts[q.Statement.Name], ","), c) {
					continue
				}
				v, err := strconv.ParseFloat(cells[i], 64)
				if err != nil {
					t.Fatalf("%s: column %s: %v", q.Name, c, err)
				}
				values[cells[0]+"|"+strings.Join(labels, ",")+"|"+c] = v
			}
		}
		return values
	}
	checked := 0
	for _, q := range gen.Queries {
		if q.Shape != asql.Series || q.Alert {
			continue
		}
		if _, ok := counts[q.Statement.Name]; !ok {
			if !notCounts[q.Statement.Name] {
				t.Errorf("%s: the series %s is neither a count nor listed as one that does not scale with its bucket", q.Name, q.Statement.Name)
			}
			continue
		}
		one, two := series(q, time.Minute), series(q, 2*time.Minute)
		nonZero := 0
		for key, v := range two {
			parts := strings.SplitN(key, "|", 2)
			b, _ := strconv.ParseInt(parts[0], 10, 64)
			want := (one[key] + one[fmt.Sprint(b+60)+"|"+parts[1]]) / 2
			if math.Abs(v-want) > 1e-9 {
				t.Errorf("%s: %s is %g at 2m, the mean of its 1m buckets is %g", q.Name, key, v, want)
			}
			if v != 0 {
				nonZero++
			}
		}
		for key, v := range one {
			parts := strings.SplitN(key, "|", 2)
			b, _ := strconv.ParseInt(parts[0], 10, 64)
			if _, ok := two[fmt.Sprint(b-b%120)+"|"+parts[1]]; !ok && v != 0 {
				t.Errorf("%s: %s (%g at 1m) has no 2m bucket", q.Name, key, v)
			}
		}
		if nonZero < 5 {
			t.Errorf("%s: only %d values other than 0", q.Name, nonZero)
		}
		checked++
	}
	if checked < 4 {
		t.Errorf("checked %d count series", checked)
	}
}
