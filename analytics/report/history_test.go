package report

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/audit"
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

// TestConflictCausesNameEveryBlocker checks conflict_causes against its
// definition, computed here pair by pair: each version conflict on an
// object with a history is blocked by every writer of a write with a later
// version than its stale stamp and a time up to the conflict's. The
// histories are out of order on purpose (writes whose order in time is not
// their order in version, no-op writes sharing a version), and the stamps
// fall on versions, between them, below the first and above the last;
// some rows are stored twice.
func TestConflictCausesNameEveryBlocker(t *testing.T) {
	t.Parallel() // its own ClickHouse server

	const spread = 3 // the hours the scenario spans
	st, db := migrated(t)
	ctx := t.Context()
	rnd := rand.New(rand.NewPCG(36, 1))
	s := &scenario{}
	writers := []string{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "system:serviceaccount:ns:ctl"}
	type write struct {
		version uint64
		at      time.Duration
		writer  string
	}
	type conflict struct {
		object string
		stale  uint64
		at     time.Duration
		writer string
	}
	histories := map[string][]write{}
	var conflicts []conflict
	for _, name := range []string{"a", "b", "c"} {
		var ws []write
		version := uint64(100)
		writer := writers[0]
		for i := range 700 { // ranges of several blocks of ranks
			version += 1 + rnd.Uint64N(5)
			// Up to six writes of disorder: a later version may be
			// logged before an earlier one.
			at := time.Duration(5*i)*time.Second + time.Duration(rnd.IntN(30))*time.Second
			// A writer at random, or on c runs of one writer's
			// writes, so that the writers of neighbouring ranks and
			// blocks differ.
			if name != "c" || rnd.IntN(8) == 0 {
				writer = writers[rnd.IntN(len(writers))]
			}
			ws = append(ws, write{version, at, writer})
			if rnd.IntN(10) == 0 { // a no-op write returns the version
				ws = append(ws, write{version, at + time.Second, writers[rnd.IntN(len(writers))]})
			}
		}
		histories[name] = ws
		for range 50 {
			// Mostly a recent stamp, as a loser holds: one of the last
			// writes stored before the conflict, so that its blockers are few.
			at := time.Duration(rnd.IntN(3550)) * time.Second
			var recent []uint64
			for _, w := range ws {
				if w.at <= at {
					recent = append(recent, w.version)
				}
			}
			slices.Sort(recent)
			var stale uint64
			switch k := rnd.IntN(6); {
			case k < 3 && len(recent) > 0:
				stale = recent[max(0, len(recent)-1-rnd.IntN(4))] - uint64(k%2)
			case k == 3:
				stale = ws[rnd.IntN(len(ws))].version
			case k == 4:
				stale = 1 + rnd.Uint64N(99) // before the history
			default:
				stale = version + 1 + rnd.Uint64N(3) // after it
			}
			conflicts = append(conflicts, conflict{name, stale, at, writers[rnd.IntN(len(writers))]})
		}
	}
	// A write logged long after its neighbours, at the last rank of a
	// block: a conflict between its commit and its log is not its doing.
	var late []write
	for i := range 600 {
		w := write{uint64(1001 + i), time.Duration(i) * time.Second, "steady"}
		if i == 2*256-1 {
			w.at, w.writer = 3000*time.Second, "late"
		}
		late = append(late, w)
	}
	histories["d"] = late
	conflicts = append(conflicts, conflict{"d", 1000, 550 * time.Second, "w1"})
	// Every write by a writer of its own: a conflict's blockers name each
	// rank of its range, so a range cut one rank short or long at any of
	// its pieces (ranks and blocks) names one writer too few or too many.
	// On e the writes are in order, and the conflicts' ranges start and
	// end on every side of the blocks' edges; on f they are a little out
	// of order, and the stamps anywhere.
	var inOrder, outOfOrder []write
	for i := range 900 {
		inOrder = append(inOrder, write{uint64(5001 + 2*i), time.Duration(3*i) * time.Second, "e-" + strconv.Itoa(i+1)})
		at := time.Duration(3*i)*time.Second + time.Duration(rnd.IntN(12))*time.Second
		outOfOrder = append(outOfOrder, write{uint64(5001 + 2*i), at, "f-" + strconv.Itoa(i)})
	}
	histories["e"], histories["f"] = inOrder, outOfOrder
	for _, first := range []int{1, 2, 16, 17, 18, 63, 64, 65, 66, 240, 256, 257, 258} {
		for _, last := range []int{first - 1, first, first + 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 258, 271, 272, 273, 511, 512, 513, 527, 528, 529, 543, 800} {
			if last >= max(first-1, 1) { // a conflict in the window
				// first is the range's first rank (the stamp is the
				// version before it), last the last write by the
				// conflict's time.
				conflicts = append(conflicts, conflict{"e", uint64(5001 + 2*(first-1) - 1), time.Duration(3*(last-1))*time.Second + time.Second, "w2"})
			}
		}
	}
	for range 120 {
		stale := 5000 + rnd.Uint64N(1802)
		conflicts = append(conflicts, conflict{"f", stale, time.Duration(rnd.IntN(2700)) * time.Second, "w3"})
	}
	// One writer's requests answered out of order far apart: on g the
	// write of version 8900 is logged first, before 600 writes of lower
	// versions, 400 of them its own, so the newest version that writer had
	// stored stays 8900 over 400 of its writes (a running maximum over
	// more than 2^8 places), and a conflict whose stamp is between their
	// versions and 8900 is its doing. Another writer's writes are in order
	// among them.
	var far []write
	for i := range 700 {
		w := write{uint64(8301 + i), time.Duration(4*i+4) * time.Second, "g-slow"}
		if i == 599 {
			w.at = time.Second
		}
		if i%3 == 1 {
			w.writer = "g-steady"
		}
		far = append(far, w)
	}
	histories["g"] = far
	for range 80 {
		conflicts = append(conflicts, conflict{"g", 8300 + rnd.Uint64N(700), time.Duration(2+rnd.IntN(2800)) * time.Second, "w4"})
	}
	// Versions as far apart as a uint64 goes, out of order: on h the
	// newest version the writer had stored is found by the versions'
	// ranks, since their differences would not fit an int64.
	huge := []uint64{3, math.MaxUint64 - 5, 1 << 63, 1<<63 - 2, 7, math.MaxUint64 - 3, 1<<63 + 1, 9}
	var wide []write
	for i, v := range huge {
		wide = append(wide, write{v, time.Duration(300*i+60) * time.Second, "h-slow"})
		wide = append(wide, write{uint64(10 + i), time.Duration(300*i+200) * time.Second, "h-steady"})
	}
	histories["h"] = wide
	for i, stale := range []uint64{2, 5, 8, 1<<63 - 3, 1<<63 - 1, 1 << 63, math.MaxUint64 - 4, math.MaxUint64 - 1} {
		for _, at := range []int{100, 250, 700, 1300, 1900, 2500} {
			conflicts = append(conflicts, conflict{"h", stale, time.Duration(at+i) * time.Second, "w5"})
		}
	}
	// Spread over three hours: a conflict's blockers are then in its hour
	// before it, in the hours before its, or both.
	for _, ws := range histories {
		for i := range ws {
			ws[i].at *= spread
		}
	}
	for i := range conflicts {
		conflicts[i].at *= spread
	}
	for _, name := range slices.Sorted(maps.Keys(histories)) { // in one order: the copies below are the same rows on every run
		ws := histories[name]
		for _, w := range ws {
			s.add(w.at, w.writer, "update", "", "configmaps", "shop", name, 200, func(r *audit.Row) {
				r.Level, r.Stamp, r.ObjectVersion, r.FullView = "RequestResponse", "1", w.version, true
			})
		}
	}
	for _, c := range conflicts {
		s.add(c.at, c.writer, "update", "", "configmaps", "shop", c.object, 409, func(r *audit.Row) { r.Stamp = strconv.FormatUint(c.stale, 10) })
	}
	// Not counted: a conflict on an object without a history, and one
	// without a decimal stamp.
	s.add(time.Second, "w0", "update", "", "configmaps", "shop", "none", 409, func(r *audit.Row) { r.Stamp = "7" })
	s.add(time.Second, "w0", "update", "", "configmaps", "shop", "a", 409, func(r *audit.Row) { r.Stamp = "x" })
	storeWithCopies(t, st, s.rows, func(i int, r audit.Row) bool { return i%7 == 0 && r.Name != "e" }) // e keeps its ranks

	// The definition over [from, until): the conflicts and the writes in
	// it.
	define := func(from, until time.Duration) (map[ConflictCause]bool, map[[2]string]uint64) {
		counts := map[[2]string]uint64{}
		for _, c := range conflicts {
			if c.at < from || c.at >= until {
				continue
			}
			blockers := map[string]bool{}
			for _, w := range histories[c.object] {
				if w.version > c.stale && w.at <= c.at && w.at >= from {
					blockers[w.writer] = true
				}
			}
			if len(blockers) == 0 {
				blockers[""] = true
			}
			for b := range blockers {
				counts[[2]string{c.writer, b}]++
			}
		}
		want := map[ConflictCause]bool{}
		for k, n := range counts {
			want[ConflictCause{Writer: k[0], BlockedBy: k[1], Conflicts: n}] = true
		}
		return want, counts
	}
	check := func(stage string, from, until time.Duration) {
		t.Helper()
		want, _ := define(from, until)
		r, err := Build(ctx, st.Conn(), Options{Database: db, Cluster: "c1", Top: 100_000, Since: t0.Add(from), Until: t0.Add(until), History: true})
		if err != nil {
			t.Fatal(err)
		}
		got := map[ConflictCause]bool{}
		for _, c := range r.ConflictCauses {
			got[c] = true
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s, [%s, %s): conflict causes\n got %v\nwant %v", stage, from, until, r.ConflictCauses, want)
		}
	}
	// The conflicts read from events as one segment, then from the hours'
	// caches (hour_conflict_blockers, hour_writer_versions) and, for the
	// hours a window cuts, from events an hour a segment.
	check("raw", 0, spread*time.Hour)
	if _, err := st.Compact(ctx, time.Unix(0, 0), 0); err != nil {
		t.Fatal(err)
	}
	var cached uint64
	if err := st.Conn().QueryRow(ctx, "SELECT count() FROM "+db+".hour_conflict_blockers").Scan(&cached); err != nil || cached < uint64(len(conflicts)) {
		t.Fatalf("the compaction cached %d version conflicts (%v), want %d at least", cached, err, len(conflicts))
	}
	for _, w := range [][2]time.Duration{{0, spread * time.Hour}, {time.Hour, spread * time.Hour}, {10*time.Minute + 13*time.Second, spread * time.Hour},
		{0, 2*time.Hour + 47*time.Minute + 31*time.Second}, {time.Hour + 10*time.Minute + 13*time.Second, 2*time.Hour + 47*time.Minute + 31*time.Second}} {
		check("compacted", w[0], w[1])
	}
	_, counts := define(0, spread*time.Hour)
	unattributed := 0
	for k, n := range counts {
		if k[1] == "" {
			unattributed += int(n)
		}
	}
	if unattributed == 0 || len(counts) < 10 {
		t.Fatalf("the scenario exercises too little: %v", counts)
	}
}
