package report

import (
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"
)

// BenchmarkGrafanaStatements runs each statement as a dashboard panel
// sends it (Grafana binder, expanded as the plugin does, "All" selected)
// over a 6-hour range that cuts hours at both ends (as "now-6h" does) and
// over the whole day, at the series' interval of a minute, on
// a day of synthetic events (10 million by default; REPORT_BENCH_EVENTS
// overrides it).
func BenchmarkGrafanaStatements(b *testing.B) {
	srv := chtest.Start(b)
	db := srv.NewDatabase(b)
	ctx := b.Context()
	store, err := store.Open(ctx, store.Options{DSN: srv.DSN(), Database: db})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := Synthesize(ctx, store.Conn(), db, "bench", benchEvents(), 42, t0, 24*time.Hour); err != nil {
		b.Fatal(err)
	}
	// Merged parts, as background merges leave them after a while, and
	// the hour caches, as serve's compaction leaves them.
	if err := store.Conn().Exec(ctx, "OPTIMIZE TABLE "+db+".events_by_hour FINAL"); err != nil {
		b.Logf("optimize events_by_hour: %v", err)
	}
	if _, err := store.Compact(ctx, t0, 0); err != nil {
		b.Fatal(err)
	}
	g := asql.Grafana{Database: db,
		Variables: panelVariables,
		Values: map[string]string{"top": "20", "gap_us": "300000000", "threshold": "5", "min_handoffs": "3", "min_writes": "50", "stale_us": "900000000",
			"storm_s": "600", "storm_rate": "0.2", "min_bucket_writes": "10", "verb": "''", "code": "''", "hide_system": "'no'"}}
	from := t0.Add(9*time.Hour + 17*time.Minute + 23*time.Second)
	ranges := []struct {
		name     string
		from, to time.Time
	}{
		{"6h-cut", from, from.Add(6 * time.Hour)},
		{"day", t0, t0.Add(24*time.Hour - time.Second)},
	}
	for _, rg := range ranges {
		// The dashboards' series have a minimum interval of a minute
		// (dashboards.MinInterval): their buckets are whole minutes.
		e := asql.Expansion{From: rg.from, To: rg.to, Interval: time.Minute,
			Vars: map[string][]string{"cluster": {"bench"}, "name": {""}}, All: map[string]bool{"namespace": true, "resource": true, "user": true}}
		for _, s := range asql.All {
			bound, err := g.Bind(s)
			if err != nil {
				b.Fatal(err)
			}
			sql, err := e.Expand(bound)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(rg.name+"/"+s.Name, func(b *testing.B) {
				for b.Loop() {
					rows, err := store.Conn().Query(ctx, sql)
					if err != nil {
						b.Fatal(err)
					}
					for rows.Next() {
					}
					rows.Close()
					if err := rows.Err(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
