package record

import (
	"cmp"
	"fmt"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

func TestRecordSetFindsEveryRowsKeyAndAddsNothingOfABrokenRecord(t *testing.T) {
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	dead := []audit.DeadLetter{{Cluster: "prod", Source: "webhook", Reason: "r", Raw: "x", ReceivedAt: 7}}
	rec := string(appendBatch(nil, &batch{cluster: "prod", rows: rows, dead: dead}))
	var set Set
	if err := set.Add(rec); err != nil {
		t.Fatal(err)
	}
	if set.Rows() != len(rows) || len(set.Dead()) != 1 || set.Dead()[0] != dead[0] {
		t.Fatalf("%d rows, dead %+v", set.Rows(), set.Dead())
	}
	for i, r := range set.rows {
		want := eventKey{"prod", rows[i].AuditID, rows[i].Stage, rows[i].Fingerprint}
		if r.key != want || r.micros != rows[i].StageMicros || r.hash != want.hash() {
			t.Errorf("row %d: key %+v micros %d, want %+v %d", i, r.key, r.micros, want, rows[i].StageMicros)
		}
	}
	for cut := 1; cut < len(rec); cut += 7 {
		before := set.Rows()
		if err := set.Add(rec[:cut]); err == nil {
			continue
		}
		if set.Rows() != before || len(set.Dead()) != 1 {
			t.Fatalf("a record cut at %d added %d rows", cut, set.Rows()-before)
		}
	}
}

func TestDedup(t *testing.T) {
	key := func(id string) rowRef {
		k := eventKey{"prod", id, audit.StageResponseComplete, 1}
		return rowRef{key: k, hash: k.hash()}
	}
	ids := func(rows []rowRef) (s []string) {
		for _, r := range rows {
			s = append(s, r.key.auditID)
		}
		return s
	}
	t.Run("distinct rows come back as the same slice, indexed", func(t *testing.T) {
		rows := []rowRef{key("a"), key("b"), key("c")}
		kept, idx := dedup(rows)
		if &kept[0] != &rows[0] || len(kept) != 3 {
			t.Fatalf("kept %v", ids(kept))
		}
		if b := key("b"); !idx.has(kept, &b) {
			t.Error("b not indexed")
		}
		if d := key("d"); idx.has(kept, &d) {
			t.Error("d found")
		}
	})
	t.Run("a repeat is dropped, the first kept, the input untouched", func(t *testing.T) {
		rows := []rowRef{key("a"), key("b"), key("a"), key("c"), key("b")}
		kept, idx := dedup(rows)
		if got := ids(kept); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
			t.Fatalf("kept %v", got)
		}
		if got := ids(rows); got[2] != "a" || got[4] != "b" {
			t.Errorf("input changed: %v", got)
		}
		if c := key("c"); !idx.has(kept, &c) {
			t.Error("c not indexed after a drop")
		}
	})
	t.Run("two keys with one hash are both kept", func(t *testing.T) {
		a, b := key("a"), key("b")
		b.hash = a.hash
		kept, _ := dedup([]rowRef{a, b})
		if len(kept) != 2 {
			t.Fatalf("kept %v", ids(kept))
		}
	})
}

func TestEventOrderIsTheEventsByHourSortingKey(t *testing.T) {
	pick := func(i int, vals ...string) string { return vals[i%len(vals)] }
	var rows []rowRef
	for i := range 5000 {
		k := eventKey{pick(i/7, "prod", "dev"), pick(i*31, "a", "ab", "ab\x00", "ab\x00x", "b", "", "0123456789abcdef0", "0123456789abcdef"),
			pick(i/3, audit.StageResponseComplete, audit.StagePanic), uint64(i % 5)}
		rows = append(rows, rowRef{key: k, micros: int64(i%4) - 1 + int64(i%3)*3_600_000_000, apiGroup: pick(i/11, "", "apps"),
			resource: pick(i/13, "configmaps", "leases"), namespace: pick(i/17, "a", "b", ""), name: pick(i/19, "x", "y", "xy")})
	}
	want := func(a, b *rowRef) int {
		return cmp.Or(strings.Compare(a.key.cluster, b.key.cluster), cmp.Compare(uint64(a.micros)/3_600_000_000, uint64(b.micros)/3_600_000_000),
			strings.Compare(a.apiGroup, b.apiGroup),
			strings.Compare(a.resource, b.resource), strings.Compare(a.namespace, b.namespace),
			strings.Compare(a.name, b.name), cmp.Compare(uint64(a.micros), uint64(b.micros)),
			strings.Compare(a.key.auditID, b.key.auditID), strings.Compare(a.key.stage, b.key.stage),
			cmp.Compare(a.key.fingerprint, b.key.fingerprint))
	}
	order := eventOrder(rows)
	if len(order) != len(rows) {
		t.Fatalf("%d positions for %d rows", len(order), len(rows))
	}
	seen := make([]bool, len(rows))
	for i, p := range order {
		if seen[p] {
			t.Fatalf("row %d twice", p)
		}
		seen[p] = true
		if i > 0 && want(&rows[order[i-1]], &rows[p]) > 0 {
			t.Fatalf("position %d: %+v before %+v", i, rows[order[i-1]], rows[p])
		}
	}
}

// FuzzRecordSet feeds arbitrary bytes to Set.Add, the path of every spool
// record to ClickHouse: no panic; it accepts exactly what the full decode
// of the tests accepts, with the same rows and dead letters; and every row
// it accepts builds its columns.
func FuzzRecordSet(f *testing.F) {
	rows := audittest.Rows(f, "prod", audittest.Events(f))
	dead := []audit.DeadLetter{{Cluster: "prod", Source: "webhook", Reason: "r", Raw: "x", ReceivedAt: 7}}
	rec := appendBatch(nil, &batch{cluster: "prod", rows: rows[:1], dead: dead})
	f.Add(rec)
	f.Add(rec[:len(rec)/2])
	withHistory := appendBatch(nil, &batch{cluster: "prod", rows: rows[5:6]}) // an update logged with its response
	f.Add(withHistory)
	f.Add(withHistory[:len(withHistory)-3])
	f.Add(appendBatch(nil, &batch{cluster: "c"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := string(data)
		var set Set
		err := set.Add(rec)
		b, decErr := decode(rec)
		if (err == nil) != (decErr == nil) {
			t.Fatalf("Set.Add: %v, decode: %v", err, decErr)
		}
		if err != nil {
			if set.Rows() != 0 || len(set.Dead()) != 0 {
				t.Fatalf("a failed record added %d rows and %d dead letters", set.Rows(), len(set.Dead()))
			}
			return
		}
		if set.Rows() != len(b.rows) || len(set.Dead()) != len(b.dead) {
			t.Fatalf("Set has %d rows and %d dead letters, decode %d and %d", set.Rows(), len(set.Dead()), len(b.rows), len(b.dead))
		}
		cols := newBlock()
		for i := range set.rows {
			if err := cols.appendRow(&set.rows[i], true); err != nil {
				t.Fatalf("row %d of an accepted record: %v", i, err)
			}
		}
	})
}

// BenchmarkRecordSetOf encodes 40,960 real-shaped rows (with their raw
// JSON) into a record, AppendRow by AppendRow, and parses it into a Set:
// the record format's CPU per event on both sides of the spool.
func BenchmarkRecordSetOf(b *testing.B) {
	tmpl := audittest.Rows(b, "bench", audittest.Events(b)[:9])
	rows := make([]audit.Row, 5*benchBlockRows)
	for i := range rows {
		rows[i] = tmpl[i%len(tmpl)]
		rows[i].AuditID = fmt.Sprintf("bench-%d", i)
	}
	b.ReportAllocs()
	for b.Loop() {
		if set := setOf(b, rows, nil); set.Rows() != len(rows) {
			b.Fatalf("%d rows, want %d", set.Rows(), len(rows))
		}
	}
	b.ReportMetric(float64(b.N*len(rows))/b.Elapsed().Seconds(), "rows/s")
}

// TestRecordsCarryFieldHistories: the rows of the real events that have a
// field history keep it through a record, a version 1 record (an earlier
// release's spool) still reads, and a history entry with no row before it
// is refused.
func TestRecordsCarryFieldHistories(t *testing.T) {
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	withHistory := 0
	for i := range rows {
		if rows[i].ObjectVersion != 0 && len(rows[i].Fields.Paths) > 0 {
			withHistory++
		}
	}
	if withHistory < 1 {
		t.Fatalf("only %d of the real events have a field history", withHistory)
	}
	rec := appendBatch(nil, &batch{cluster: "prod", rows: rows})
	set := NewSet(len(rows))
	if err := set.Add(string(rec)); err != nil {
		t.Fatal(err)
	}
	hists := 0
	for _, r := range set.rows {
		if r.hist != 0 {
			hists++
			d := recordReader{s: r.rec, i: r.hist}
			var h History
			d.readHistory(&h, true)
			if d.err != nil || h.ObjectVersion == 0 {
				t.Errorf("history of %s: %v, version %d", r.key.auditID, d.err, h.ObjectVersion)
			}
		}
	}
	if hists < withHistory {
		t.Errorf("%d rows kept a history, %d had one", hists, withHistory)
	}

	old := appendBatch(nil, &batch{cluster: "prod", rows: []audit.Row{{AuditID: "a", Stage: "ResponseComplete"}}})
	old[0] = 1
	if err := NewSet(1).Add(string(old)); err != nil {
		t.Errorf("a version 1 record: %v", err)
	}
	orphan := append(AppendHeader(nil, "prod"), tagHistory, 5, 0, 0)
	if err := NewSet(1).Add(string(orphan)); err == nil {
		t.Error("a history entry without its row was accepted")
	}
}
