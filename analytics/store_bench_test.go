package analytics

import (
	"fmt"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/internal/testenv"
)

// benchStore is a migrated store in a fresh database of a clickhouse-server
// of the benchmark's own.
func benchStore(b *testing.B) *Store {
	b.Helper()
	testenv.SkipIfShort(b, "starts clickhouse-server")
	srv := chtestStart(b)
	st, err := OpenStore(b.Context(), StoreOptions{DSN: srv.DSN(), Database: srv.NewDatabase(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	return st
}

// BenchmarkStoreInsert inserts batches of 20,000 fresh rows (dedup lookup
// included) and reports rows/s, and separately the lookup alone.
func BenchmarkStoreInsert(b *testing.B) {
	st := benchStore(b)
	tmpl := decodeAll(b, "bench", realEvents(b)[:9])
	const n = 20000
	run := 0
	var lookup time.Duration
	b.ReportAllocs()
	for b.Loop() {
		run++
		rows := make([]audit.Row, n)
		for i := range rows {
			rows[i] = tmpl[i%len(tmpl)]
			rows[i].AuditID = fmt.Sprintf("run%d-%d", run, i)
		}
		set, err := recordSetOf(rows, nil, false)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := st.fresh(b.Context(), set.rows, map[eventKey]uint32{}); err != nil {
			b.Fatal(err)
		}
		lookup += time.Since(t0)
		if _, err := st.Insert(b.Context(), rows, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(run*n)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(lookup.Milliseconds())/float64(run), "lookup-ms/batch")
}
