package analytics

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/audit"
)

// BenchmarkCheckOnADayOfKeys times the check for concurrent copies after
// a 40,000-row insert into a day that already holds BENCH_DAY_KEYS
// (default 4,000,000) keys: the whole check, which reads granules of most
// of the day's keys, and the check of the parts written since the lookup,
// side by side on the same batch.
func BenchmarkCheckOnADayOfKeys(b *testing.B) {
	st := benchStore(b)
	db := st.db
	tmpl := decodeAll(b, "bench", realEvents(b)[:9])
	tset, err := recordSetOf(tmpl, nil, false)
	if err != nil {
		b.Fatal(err)
	}
	day := time.UnixMicro(tset.rows[0].micros).UTC().Format(time.DateOnly)
	for _, r := range tset.rows {
		if d := time.UnixMicro(r.micros).UTC().Format(time.DateOnly); d != day {
			b.Fatalf("the template events span days %s and %s", day, d)
		}
	}
	keys := 4_000_000
	if v := os.Getenv("BENCH_DAY_KEYS"); v != "" {
		if keys, err = strconv.Atoi(v); err != nil {
			b.Fatalf("BENCH_DAY_KEYS: %v", err)
		}
	}
	if err := st.conn.Exec(b.Context(), fmt.Sprintf(`INSERT INTO %s.stored_keys (event_date, cluster, audit_id, stage, fingerprint)
		SELECT toDate(?), 'bench', toString(generateUUIDv4()), 'ResponseComplete', number FROM system.numbers LIMIT %d`, db, keys), day); err != nil {
		b.Fatal(err)
	}
	if err := st.conn.Exec(b.Context(), "OPTIMIZE TABLE "+db+".stored_keys FINAL"); err != nil {
		b.Fatal(err)
	}
	// The day's part must be older than the check's window, as a day's
	// parts are.
	time.Sleep(recentMargin + 2*time.Second)
	const n = 40000
	run := 0
	var whole, recent time.Duration
	for b.Loop() {
		run++
		rows := make([]audit.Row, n)
		for i := range rows {
			rows[i] = tmpl[i%len(tmpl)]
			rows[i].AuditID = fmt.Sprintf("%08x-%d-%d", uint32(i*2654435761), run, i)
		}
		set, err := recordSetOf(rows, nil, false)
		if err != nil {
			b.Fatal(err)
		}
		refs, _ := dedup(set.rows, nil)
		since := time.Now()
		if err := st.insertEvents(b.Context(), refs); err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			q   keyQuery
			sum *time.Duration
		}{{keyQuery{doubled: true}, &whole}, {keyQuery{doubled: true, since: since}, &recent}} {
			t0 := time.Now()
			if err := st.lookupKeys(b.Context(), refs, c.q, func(eventKey, uint32) { b.Fatal("a copy in a batch of fresh keys") }); err != nil {
				b.Fatal(err)
			}
			*c.sum += time.Since(t0)
		}
	}
	b.ReportMetric(float64(whole.Milliseconds())/float64(run), "whole-check-ms")
	b.ReportMetric(float64(recent.Milliseconds())/float64(run), "recent-parts-check-ms")
	b.ReportMetric(float64(recent)/float64(whole), "recent/whole")
}
