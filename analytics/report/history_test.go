package report

import (
	"testing"
	"time"
)

// TestSynthesizedHistoryHoldsEveryFinding keeps the cross-checks honest:
// the binder, duplicate and engine tests compare the history findings
// over Synthesize's rows, which must then hold each of them (lost updates
// of every cause, fights, attributed conflicts, no-op writes).
func TestSynthesizedHistoryHoldsEveryFinding(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	if err := Synthesize(ctx, store.Conn(), db, "bench", 60_000, 5, t0, 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := Build(ctx, store.Conn(), Options{Database: db, Cluster: "bench", Top: 100_000, Since: t0, Until: t0.Add(4 * time.Hour), History: true})
	if err != nil {
		t.Fatal(err)
	}
	causes := map[string]int{}
	for _, l := range r.LostUpdates {
		causes[l.Cause]++
		if l.Writer == l.OverwrittenWriter || l.Time <= l.OverwrittenTime {
			t.Errorf("lost update %+v: the writer overwrote itself, or before the change it overwrote", l)
		}
	}
	attributed := 0
	for _, c := range r.ConflictCauses {
		if c.BlockedBy != "" {
			attributed += int(c.Conflicts)
		}
	}
	t.Logf("lost updates by cause %v, %d fights, %d conflict causes (%d attributed), %d no-op writers",
		causes, len(r.FieldFights), len(r.ConflictCauses), attributed, len(r.NoopWrites))
	for _, c := range []string{"stampless", "laundered_stamp", "forced_apply", "list_replaced"} {
		if causes[c] == 0 {
			t.Errorf("no lost update caused %s", c)
		}
	}
	if len(r.FieldFights) == 0 || attributed == 0 || len(r.NoopWrites) == 0 || len(r.FieldWriters) == 0 {
		t.Errorf("%d fights, %d attributed conflicts, %d no-op writers, %d field writers: the cross-checks compare empty findings",
			len(r.FieldFights), attributed, len(r.NoopWrites), len(r.FieldWriters))
	}
	// One definition of a change: every lost update and every fight's
	// changes are among the field writers' changes.
	type key struct{ group, resource, ns, field, writer string }
	changes := map[key]uint64{}
	for _, w := range r.FieldWriters {
		k := key{w.APIGroup, w.Resource, w.Namespace, w.Field, w.Writer}
		if _, twice := changes[k]; twice || w.Changes == 0 || w.Objects == 0 || w.Objects > w.Changes || w.First > w.Last {
			t.Errorf("field writer %+v: listed twice, or its counts or times are wrong", w)
		}
		changes[k] = w.Changes
	}
	lost := map[key]uint64{}
	for _, l := range r.LostUpdates {
		lost[key{l.APIGroup, l.Resource, l.Namespace, l.Field, l.Writer}]++
	}
	for k, n := range lost {
		if changes[k] < n {
			t.Errorf("%+v lost %d updates, but the field writers count %d changes of it", k, n, changes[k])
		}
	}
	perField := map[key]uint64{}
	for k, n := range changes {
		k.writer = ""
		perField[k] += n
	}
	for _, f := range r.FieldFights {
		if k := (key{f.APIGroup, f.Resource, f.Namespace, f.Field, ""}); perField[k] < f.Changes {
			t.Errorf("fight %+v: %d changes, more than the field writers' %d", f, f.Changes, perField[k])
		}
	}
}
