package store

import (
	"fmt"
	"testing"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/testenv"
)

// benchStore is a migrated store in a fresh database of a clickhouse-server
// of the benchmark's own.
func benchStore(b *testing.B) *Store {
	b.Helper()
	testenv.SkipIfShort(b, "starts clickhouse-server")
	srv := chtestStart(b)
	st, err := Open(b.Context(), Options{DSN: srv.DSN(), Database: srv.NewDatabase(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	return st
}

// BenchmarkStoreInsert inserts batches of 20,000 fresh rows and reports
// rows/s.
func BenchmarkStoreInsert(b *testing.B) {
	st := benchStore(b)
	tmpl := audittest.Rows(b, "bench", audittest.Events(b)[:9])
	const n = 20000
	run := 0
	b.ReportAllocs()
	for b.Loop() {
		run++
		rows := make([]audit.Row, n)
		for i := range rows {
			rows[i] = tmpl[i%len(tmpl)]
			rows[i].AuditID = fmt.Sprintf("run%d-%d", run, i)
		}
		if _, err := st.InsertRecords(b.Context(), recordtest.Set(rows, nil)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(run*n)/b.Elapsed().Seconds(), "rows/s")
}
