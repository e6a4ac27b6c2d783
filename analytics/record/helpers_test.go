package record

import (
	"reflect"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// normalize drops what a stored row does not keep (Raw, and what no
// column stores: the impersonated user's groups and the request and
// response bodies) and makes empty lists nil, so that rows compare with
// reflect.DeepEqual.
func normalize(r *audit.Row) {
	r.Raw = ""
	r.ImpersonatedGroups, r.RequestObject, r.ResponseObject = nil, "", ""
	if r.ObjectVersion == 0 { // a row without a history keeps none of it
		r.Force, r.Apply, r.FullView, r.RequestManaged, r.Created, r.Fields = false, false, false, false, false, audit.Fields{}
	}
	if len(r.Fields.Paths) == 0 {
		r.Fields = audit.Fields{}
	}
	for _, p := range []*[]string{&r.UserGroups, &r.CauseReasons, &r.CauseFields, &r.AnnotationKeys, &r.AnnotationValues} {
		if len(*p) == 0 {
			*p = nil
		}
	}
}

// batch is what a test puts into one record, and reads back.
type batch struct {
	cluster string
	rows    []audit.Row
	dead    []audit.DeadLetter
}

// appendBatch encodes b onto dst (the product appends a record entry by
// entry: AppendHeader, AppendRow, AppendDeadLetter).
func appendBatch(dst []byte, b *batch) []byte {
	dst = AppendHeader(dst, b.cluster)
	for i := range b.rows {
		dst = AppendRow(dst, &b.rows[i])
	}
	for i := range b.dead {
		dst = AppendDeadLetter(dst, &b.dead[i])
	}
	return dst
}

// decode reads a record back into rows, through the one parser
// (readRecord) and the row layout, as the inverse of AppendRow.
func decode(rec string) (*batch, error) {
	b := &batch{}
	err := readRecord(rec, func(cluster string, d *recordReader) {
		b.cluster = cluster
		r := audit.Row{Cluster: cluster}
		for _, f := range &rowStringFields {
			*f.str(&r) = d.str()
		}
		for _, f := range &rowListFields {
			if k := d.count(); k > 0 {
				l := make([]string, k)
				for i := range l {
					l[i] = d.str()
				}
				*f.list(&r) = l
			}
		}
		d.tail().setOn(&r)
		if d.err == nil {
			b.rows = append(b.rows, r)
		}
	}, func(d *recordReader) {
		var h History
		d.readHistory(&h, true)
		if d.err == nil && len(b.rows) > 0 {
			r := &b.rows[len(b.rows)-1]
			r.ObjectVersion, r.FullView, r.RequestManaged, r.Force, r.Apply, r.Created = h.ObjectVersion, h.FullView, h.RequestManaged, h.Force, h.Apply, h.Created
			r.Fields = audit.Fields{Paths: h.Paths, Hashes: h.Hashes}
		}
	}, func(dl audit.DeadLetter) { b.dead = append(b.dead, dl) })
	return b, err
}

// setOf encodes rows and dead letters into records (one per cluster) and
// parses them into a Set.
func setOf(tb testing.TB, rows []audit.Row, dead []audit.DeadLetter) *Set {
	tb.Helper()
	recs := map[string][]byte{}
	var order []string
	rec := func(cluster string) []byte {
		r, ok := recs[cluster]
		if !ok {
			r = AppendHeader(nil, cluster)
			order = append(order, cluster)
		}
		return r
	}
	for i := range rows {
		recs[rows[i].Cluster] = AppendRow(rec(rows[i].Cluster), &rows[i])
	}
	for i := range dead {
		recs[dead[i].Cluster] = AppendDeadLetter(rec(dead[i].Cluster), &dead[i])
	}
	set := NewSet(len(rows))
	for _, c := range order {
		if err := set.Add(string(recs[c])); err != nil {
			tb.Fatal(err)
		}
	}
	return set
}

func TestRecordRoundTrips(t *testing.T) {
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	in := batch{cluster: "prod", rows: rows, dead: []audit.DeadLetter{{Cluster: "prod", Source: "file", Reason: "r", Raw: "x", ReceivedAt: 42}}}
	rec := appendBatch(nil, &in)
	out, err := decode(string(rec))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.rows) != len(rows) || len(out.dead) != 1 || out.dead[0] != in.dead[0] {
		t.Fatalf("%d rows and dead %+v back, want %d and %+v", len(out.rows), out.dead, len(rows), in.dead)
	}
	for i := range rows {
		normalize(&rows[i])
		r := out.rows[i]
		normalize(&r)
		if !reflect.DeepEqual(r, rows[i]) {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, r, rows[i])
		}
	}
	// The spool's checksums catch damage; a cut record still never
	// decodes as the whole.
	for cut := range len(rec) {
		if b, err := decode(string(rec[:cut])); err == nil && len(b.rows)+len(b.dead) >= len(rows)+1 {
			t.Fatalf("a record cut at %d of %d decoded whole", cut, len(rec))
		}
	}
}
