package report

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/analytics/store/enginetest"
	"github.com/stampguard/stampguard/test/chtest"
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
	// events until they are compacted again (REPORT_BENCH_RECOMPACT).
	// REPORT_BENCH_PRUNE then deletes the superseded versions, timed. The
	// report is timed at each step, so that one run gives every figure.
	if d, err := strconv.ParseUint(os.Getenv("REPORT_BENCH_DUPLICATES"), 10, 64); err == nil && d > 0 {
		cut := o
		cut.Since, cut.Until = cutWindow()
		timeReport := func(prefix string) {
			for _, w := range []struct {
				name string
				o    Options
			}{{"whole", o}, {"whole-cut-hours", cut}} {
				b.Run("rollup/"+prefix+w.name, func(b *testing.B) {
					for b.Loop() {
						if _, err := Build(ctx, store.Conn(), w.o); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
		timeReport("no-duplicates-")
		logSizes(b, store, db, "compacted once")
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
			logSizes(b, store, db, "with the copies, compacted again")
		}
		if os.Getenv("REPORT_BENCH_PRUNE") != "" {
			timeReport("two-versions-")
			time.Sleep(1100 * time.Millisecond) // past the records, by the server's clock
			start := time.Now()
			pruned, err := store.Prune(ctx, 0)
			if err != nil {
				b.Fatal(err)
			}
			issued := time.Since(start)
			chtest.WaitForMutations(b, store.Conn(), db)
			b.Logf("pruned %d versions: deletes issued in %s, done after %s", pruned, issued.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			logSizes(b, store, db, "pruned")
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
		if !mode.raw { // side by side: one query at a time; and with the history's findings
			history := o
			history.History = true
			b.Run(mode.name+"/whole-history", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), history); err != nil {
						b.Fatal(err)
					}
				}
			})
			historyCut := history
			historyCut.Since, historyCut.Until = cutWindow()
			b.Run(mode.name+"/whole-history-cut-hours", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), historyCut); err != nil {
						b.Fatal(err)
					}
				}
			})
			seq := o
			seq.parallel = 1
			b.Run(mode.name+"/whole-sequential", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), seq); err != nil {
						b.Fatal(err)
					}
				}
			})
			// Side by side: the field changes stitching every hour alone,
			// without the blocks of hours the compaction built.
			hoursOnly := history
			hoursOnly.hoursOnly = true
			b.Run(mode.name+"/whole-history-hours-only", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), hoursOnly); err != nil {
						b.Fatal(err)
					}
				}
			})
			historySeq := history
			historySeq.parallel = 1
			b.Run(mode.name+"/whole-history-sequential", func(b *testing.B) {
				for b.Loop() {
					if _, err := Build(ctx, store.Conn(), historySeq); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		// As `--since 24h` gives: edges that cut hours, read per request.
		cut := o
		cut.Since, cut.Until = cutWindow()
		b.Run(mode.name+"/whole-cut-hours", func(b *testing.B) {
			for b.Loop() {
				if _, err := Build(ctx, store.Conn(), cut); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Each query alone, over the whole day and over the cut window,
		// and over the day without the blocks of hours.
		hoursOnly := o
		hoursOnly.hoursOnly = true
		for _, w := range []struct {
			name string
			o    Options
		}{{"", o}, {"cut-hours/", cut}, {"hours-only/", hoursOnly}} {
			w.o.History = true // planned as a report with --history plans
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
	// Last, as it rebuilds them: the blocks of the day's clean hours
	// (asql.BlockSizes), built anew each run from empty block tables, as
	// the compaction builds them once the hours are clean.
	b.Run("rollup/build-blocks", func(b *testing.B) {
		built := 0
		for b.Loop() {
			for _, table := range append(slices.Clone(asql.BlockTables), "block_caches") {
				if err := store.Conn().Exec(ctx, "TRUNCATE TABLE "+db+"."+table); err != nil {
					b.Fatal(err)
				}
			}
			blocks, err := store.CompactBlocks(ctx, t0)
			if err != nil {
				b.Fatal(err)
			}
			built = len(blocks)
		}
		b.ReportMetric(float64(built), "blocks/op")
	})
}

// cutWindow is the benchmark's window that cuts hours, as `--since 24h`
// gives: edges read per request.
func cutWindow() (since, until time.Time) {
	return t0.Add(17*time.Minute + 13*time.Second + 5*time.Microsecond), t0.Add(23*time.Hour + 41*time.Minute)
}

// logSizes logs the bytes on disk of the event tables and of the caches
// (a benchmark's reading of system.parts: what a superseded version of
// the caches costs).
func logSizes(b *testing.B, st *store.Store, db, when string) {
	b.Helper()
	rows, err := st.Conn().Query(b.Context(), "SELECT table, sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND database = ? GROUP BY table ORDER BY table", db)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var events, caches uint64
	for rows.Next() {
		var table string
		var n, bytes uint64
		if err := rows.Scan(&table, &n, &bytes); err != nil {
			b.Fatal(err)
		}
		switch {
		case table == "events_by_hour" || table == "events":
			events += bytes
		case slices.Contains(enginetest.CompactedTables, table):
			caches += bytes
		default:
			continue
		}
		b.Logf("%s: %s %d rows, %d bytes", when, table, n, bytes)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: events %d bytes, caches %d bytes (%.1f %%)", when, events, caches, 100*float64(caches)/float64(max(events, 1)))
}
