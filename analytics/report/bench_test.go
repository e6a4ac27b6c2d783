package report

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/chtest"
)

// benchEvents is the table size of the report benchmarks; REPORT_BENCH_EVENTS overrides it.
func benchEvents() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("REPORT_BENCH_EVENTS"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 10_000_000
}

// BenchmarkReport builds the whole report, and runs each query alone, over
// a day of synthetic events (10 million by default) on a real ClickHouse.
func BenchmarkReport(b *testing.B) {
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
	n := benchEvents()
	start := time.Now()
	if err := Synthesize(ctx, store.Conn(), db, "bench", n, 42, t0, 24*time.Hour); err != nil {
		b.Fatal(err)
	}
	b.Logf("synthesized %d events in %s", n, time.Since(start).Round(time.Millisecond))
	// Merged parts, as background merges leave them after a while, and
	// the hour caches, as serve's compaction leaves them.
	if err := store.Conn().Exec(ctx, "OPTIMIZE TABLE "+db+".events_by_hour FINAL"); err != nil {
		b.Logf("optimize events: %v", err)
	}
	if _, err := store.Compact(ctx, t0, 0); err != nil {
		b.Fatal(err)
	}
	o := Options{Database: db, Cluster: "bench", Since: t0, Until: t0.Add(24 * time.Hour), Top: 10}
	o.setDefaults()
	r, err := Build(ctx, store.Conn(), o)
	if err != nil {
		b.Fatal(err)
	}
	if r.Totals.Requests < n*99/100 || r.Totals.VersionConflicts == 0 || len(r.RetryLoops) == 0 || len(r.LeaseHolderChanges) == 0 || len(r.PolicyDecisions) == 0 {
		b.Fatalf("synthetic data does not exercise every section: %+v, %d loops, %d leases, %d decisions", r.Totals, len(r.RetryLoops), len(r.LeaseHolderChanges), len(r.PolicyDecisions))
	}
	// REPORT_BENCH_DUPLICATES=d stores d events a second time, spread
	// over the day, as racing writers would: the report must still say
	// the same, and (the hours they touched dirty) reads those hours from
	// events until they are compacted again.
	if d, err := strconv.ParseUint(os.Getenv("REPORT_BENCH_DUPLICATES"), 10, 64); err == nil && d > 0 {
		if err := store.Conn().Exec(ctx, fmt.Sprintf("INSERT INTO %s.events_by_hour SELECT * FROM %s.events_by_hour WHERE cityHash64(audit_id) %% %d = 0",
			db, db, max(n/d, 1))); err != nil {
			b.Fatal(err)
		}
		again, err := Build(ctx, store.Conn(), o)
		if err != nil {
			b.Fatal(err)
		}
		if again.Totals != r.Totals {
			b.Fatalf("with duplicates the totals are %+v, without %+v", again.Totals, r.Totals)
		}
		if os.Getenv("REPORT_BENCH_RECOMPACT") != "" {
			if _, err := store.Compact(ctx, t0, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	var rollupRows uint64
	if err := store.Conn().QueryRow(ctx, "SELECT count() FROM "+db+".hour_requests").Scan(&rollupRows); err != nil {
		b.Fatal(err)
	}
	b.Logf("hour_requests holds %d rows for %d events", rollupRows, n)
	// Side by side: the rollup-backed report (whole hours from
	// request_rollup) and the raw-only computation (NoRollup).
	for _, mode := range []struct {
		name string
		raw  bool
	}{{"rollup", false}, {"raw", true}} {
		o := o
		o.NoRollup = mode.raw
		b.Run(mode.name+"/whole", func(b *testing.B) {
			for b.Loop() {
				if _, err := Build(ctx, store.Conn(), o); err != nil {
					b.Fatal(err)
				}
			}
		})
		if !mode.raw { // side by side: one query at a time
			seq := o
			seq.parallel = 1
			b.Run(mode.name+"/whole-sequential", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), seq); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		// As `--since 24h` gives: edges that cut hours, read per request.
		cut := o
		cut.Since, cut.Until = t0.Add(17*time.Minute+13*time.Second+5*time.Microsecond), t0.Add(23*time.Hour+41*time.Minute)
		b.Run(mode.name+"/whole-cut-hours", func(b *testing.B) {
			for b.Loop() {
				if _, err := Build(ctx, store.Conn(), cut); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Each query alone, over the whole day and over the cut window.
		for _, w := range []struct {
			name string
			o    Options
		}{{"", o}, {"cut-hours/", cut}} {
			if err := w.o.split(ctx, store.Conn()); err != nil {
				b.Fatal(err)
			}
			q := w.o.querier(ctx, store.Conn())
			for _, query := range All {
				b.Run(mode.name+"/"+w.name+query.Name, func(b *testing.B) {
					for b.Loop() {
						if err := q.each(query, func(rows driverRows) error { return nil }); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
