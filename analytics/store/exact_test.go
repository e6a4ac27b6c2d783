package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// The invariant (docs/auditsink.md, "Exactly once"): every figure counts
// each stored event once, however many copies of it were inserted, by
// whom and in which order, and whether an hour is read from its cache or
// from events. These tests store the same events the hard ways and require
// the whole report, read both ways, to equal the report of one clean
// insert.

// exactRows are the real events under audit IDs of their own (round), so
// that each round is new.
func exactRows(t *testing.T, round string) []audit.Row {
	t.Helper()
	rows := audittest.Rows(t, "exact", audittest.Events(t))
	for i := range rows {
		rows[i].AuditID = round + "-" + rows[i].AuditID
		rows[i].Fingerprint = audit.Fingerprint(&rows[i])
	}
	return rows
}

// window is the span of rows, widened to whole hours.
func window(rows []audit.Row) (time.Time, time.Time) {
	lo, hi := rows[0].StageMicros, rows[0].StageMicros
	for _, r := range rows {
		lo, hi = min(lo, r.StageMicros), max(hi, r.StageMicros)
	}
	return time.UnixMicro(lo).UTC().Truncate(time.Hour), time.UnixMicro(hi).UTC().Truncate(time.Hour).Add(time.Hour)
}

// figures is the whole JSON report of st over [since, until): from the hour
// caches where they are clean, or (raw) from events alone.
func figures(t *testing.T, st *Store, since, until time.Time, raw bool) string {
	t.Helper()
	r, err := report.Build(t.Context(), st.conn, report.Options{Database: st.db, Cluster: "exact", Since: since, Until: until,
		NoRollup: raw, Top: 1000, LoopThreshold: 2})
	if err != nil && !errors.Is(err, report.ErrNoEvents) {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// truth is the report of rows inserted once into a database of their own.
func truth(t *testing.T, rows []audit.Row) string {
	t.Helper()
	st, _ := newStore(t, false)
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	since, until := window(rows)
	return figures(t, st, since, until, true)
}

// cleanHours counts the hours of [since, until) that read from caches.
func cleanHours(t *testing.T, st *Store, since, until time.Time) uint64 {
	t.Helper()
	return count(t, st, fmt.Sprintf("SELECT count() FROM (SELECT * FROM %s)",
		st.sql(cleanHoursSQL(since, until))))
}

func cleanHoursSQL(since, until time.Time) string {
	return asql.CleanHours(strconv.FormatInt(since.Unix(), 10), strconv.FormatInt(until.Unix(), 10))
}

// requireTruth fails unless st's report, read both ways, is want.
func requireTruth(t *testing.T, st *Store, want string, since, until time.Time, when string) {
	t.Helper()
	for _, raw := range []bool{false, true} {
		if got := figures(t, st, since, until, raw); got != want {
			t.Fatalf("%s (raw reads %v): the report differs from the ground truth\ngot  %s\nwant %s", when, raw, got, want)
		}
	}
}

// TestEveryCopyCountsOnce stores the events the ways writers really do:
// three writers insert the whole batch at the same moment, a fourth a part
// of it, the hours are compacted, and a redelivery lands after that. Every
// figure equals one clean insert's, from the caches and from events, and
// after the copies merge away.
func TestEveryCopyCountsOnce(t *testing.T) {
	rows := exactRows(t, "copies")
	want := truth(t, rows)
	since, until := window(rows)

	st, srv := newStore(t, false)
	stores := []*Store{st}
	for range 3 {
		o, err := Open(t.Context(), Options{DSN: srv.DSN(), Database: st.db})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		stores = append(stores, o)
	}
	// Merges would collapse the copies before the reads could meet them.
	if err := st.conn.Exec(t.Context(), "SYSTEM STOP MERGES "+st.db+".events_by_hour"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, len(stores))
	for i, o := range stores {
		batch := rows
		if i == 3 {
			batch = rows[len(rows)/3:]
		}
		wg.Go(func() {
			<-start
			_, errs[i] = o.InsertRecords(t.Context(), recordtest.Set(batch, nil))
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st, "SELECT count() FROM {db}.events_by_hour"); n <= uint64(len(rows)) {
		t.Fatalf("events holds %d rows for %d events: the copies merged before the test could read them", n, len(rows))
	}
	requireTruth(t, st, want, since, until, "after racing inserts")

	if _, err := st.Compact(t.Context(), since, 0); err != nil {
		t.Fatal(err)
	}
	if n := cleanHours(t, st, since, until); n == 0 {
		t.Fatal("no hour is clean after a compaction")
	}
	requireTruth(t, st, want, since, until, "after compaction")

	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows[:len(rows)/2], nil)); err != nil {
		t.Fatal(err)
	}
	requireTruth(t, st, want, since, until, "after a redelivery into compacted hours")

	for _, q := range []string{"SYSTEM START MERGES " + st.db + ".events_by_hour", "OPTIMIZE TABLE " + st.db + ".events_by_hour FINAL"} {
		if err := st.conn.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, st, "SELECT count() FROM {db}.events_by_hour"); n != uint64(len(rows)) {
		t.Errorf("after OPTIMIZE FINAL events holds %d rows, want %d", n, len(rows))
	}
	requireTruth(t, st, want, since, until, "after OPTIMIZE FINAL")
}

// TestCompactionMissesNothingAWriterStores lets a second writer store new
// events of the hours at each step of a compaction. Whatever it stored,
// the report counts: an insert after the marks were counted adds a mark,
// so the compacted version is not clean, and the hour is read from events
// until the next compaction.
func TestCompactionMissesNothingAWriterStores(t *testing.T) {
	first, late := exactRows(t, "first"), exactRows(t, "late")
	since, until := window(first)
	all := append(append([]audit.Row(nil), first...), late...)
	want := truth(t, all)

	for _, step := range []string{hookMarksCounted, hookCachesWritten} {
		t.Run("another writer stores once the "+step, func(t *testing.T) {
			st, srv := newStore(t, false)
			if _, err := st.InsertRecords(t.Context(), recordtest.Set(first, nil)); err != nil {
				t.Fatal(err)
			}
			other, err := Open(t.Context(), Options{DSN: srv.DSN(), Database: st.db})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			st.hook = func(at string) {
				if at != step {
					return
				}
				if _, err := other.InsertRecords(t.Context(), recordtest.Set(late, nil)); err != nil {
					t.Error(err)
				}
			}
			if _, err := st.Compact(t.Context(), since, 0); err != nil {
				t.Fatal(err)
			}
			st.hook = nil
			if n := cleanHours(t, st, since, until); n != 0 {
				t.Errorf("%d hours read as clean although a writer stored into every one after their marks were counted", n)
			}
			requireTruth(t, st, want, since, until, "after the raced compaction")
			if _, err := st.Compact(t.Context(), since, 0); err != nil {
				t.Fatal(err)
			}
			if n := cleanHours(t, st, since, until); n == 0 {
				t.Error("no hour is clean after a compaction that nothing raced")
			}
			requireTruth(t, st, want, since, until, "after the next compaction")
		})
	}
}

// TestAnInsertAppliedInPartCountsOnceItsRetryLands reproduces what a
// ClickHouse killed in the middle of an INSERT leaves: the events part
// written, its view's mark not. The sink's retry inserts the batch again,
// and every figure is exact once it returns, in compacted hours too.
func TestAnInsertAppliedInPartCountsOnceItsRetryLands(t *testing.T) {
	first, killed := exactRows(t, "before"), exactRows(t, "killed")
	since, until := window(first)
	want := truth(t, append(append([]audit.Row(nil), first...), killed...))

	st, _ := newStore(t, false)
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(first, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Compact(t.Context(), since, 0); err != nil {
		t.Fatal(err)
	}
	// The part without its mark: the view is away while it is written.
	var view string
	if err := st.conn.QueryRow(t.Context(), "SHOW CREATE TABLE "+st.db+".hour_marks_mv").Scan(&view); err != nil {
		t.Fatal(err)
	}
	if err := st.conn.Exec(t.Context(), "DROP TABLE "+st.db+".hour_marks_mv"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(killed, nil)); err != nil {
		t.Fatal(err)
	}
	if err := st.conn.Exec(t.Context(), view); err != nil {
		t.Fatal(err)
	}
	// The retry, as the writer's Retry or the spool's replay makes it.
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(killed, nil)); err != nil {
		t.Fatal(err)
	}
	requireTruth(t, st, want, since, until, "after the retry")
	if _, err := st.Compact(t.Context(), since, 0); err != nil {
		t.Fatal(err)
	}
	requireTruth(t, st, want, since, until, "after the retry's hours were compacted")
}
