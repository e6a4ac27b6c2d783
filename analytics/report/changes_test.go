package report

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
)

// TestFieldChangesFollowTheirDefinition checks the field changes (the
// lost updates and the field writers read them) and the no-op writes
// against their definitions, computed here write by write (changesOf,
// noopsOf). The histories hold what makes the statements hard: versions logged out of time order,
// no-op writes sharing a version, copies of rows, Scale writes that show
// spec.replicas alone, fields that come and go, set-like lists whose
// items repeat and come in any order, keyed list items, a create, and
// every basis of a write. Two windows: the whole history, and one that
// starts in its middle (a change before it is no one's). Compacted, the
// hours are read from their caches and from a block of two hours, whose
// hours also meet at a version or interleave, and which meets the hour
// after it at a version (blockEdgeScenario).
func TestFieldChangesFollowTheirDefinition(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	st, db := migrated(t)
	ctx := t.Context()
	s := definitionScenario()
	blockEdgeScenario(s)
	storeWithCopies(t, st, s.rows, func(i int, _ audit.Row) bool { return i%9 == 0 })

	causes := map[string]int{}
	check := func(stage string, windows ...[2]time.Duration) {
		t.Helper()
		for _, w := range windows {
			o := Options{Database: db, Cluster: "c1", Top: 100_000, Since: t0.Add(w[0]), Until: t0.Add(w[1]), History: true}
			r, err := Build(ctx, st.Conn(), o)
			if err != nil {
				t.Fatal(err)
			}
			lost, writersWant := changesOf(s.rows, o.Since, o.Until)
			if got := set(r.LostUpdates); !maps.Equal(got, set(lost)) {
				t.Errorf("%s, [%s, %s): lost updates\n got %v\nwant %v", stage, w[0], w[1], r.LostUpdates, lost)
			}
			if got := set(r.FieldWriters); !maps.Equal(got, set(writersWant)) {
				t.Errorf("%s, [%s, %s): field writers\n got %v\nwant %v", stage, w[0], w[1], r.FieldWriters, writersWant)
			}
			if got, want := set(r.NoopWrites), set(noopsOf(s.rows, o.Since, o.Until)); !maps.Equal(got, want) {
				t.Errorf("%s, [%s, %s): no-op writes\n got %v\nwant %v", stage, w[0], w[1], r.NoopWrites, want)
			}
			for _, l := range lost {
				causes[l.Cause]++
			}
		}
	}
	compact := func() {
		t.Helper()
		if _, err := st.Compact(ctx, time.Unix(0, 0), 0); err != nil {
			t.Fatal(err)
		}
	}
	// blocks are the blocks the plan of [from, to) reads in place of its
	// hours.
	blocks := func(from, to time.Duration) []asql.Block {
		t.Helper()
		o := Options{Database: db, Cluster: "c1", Since: t0.Add(from), Until: t0.Add(to), History: true}
		if err := o.split(ctx, st.Conn()); err != nil {
			t.Fatal(err)
		}
		return o.plan.Blocks
	}
	whole, cut := [2]time.Duration{0, 3 * time.Hour}, [2]time.Duration{30 * time.Minute, 3 * time.Hour}
	// Every hour read raw, a segment each.
	check("raw", whole, cut)
	// The hours from their caches, whole or cut by the window; t0's hour
	// and the next make a block (t0 is 08:00), which the windows that hold
	// both read in place of their bounds.
	compact()
	if b := blocks(0, 3*time.Hour); len(b) != 1 || !b[0].Start.Equal(t0) || b[0].Hours != 2 {
		t.Fatalf("compacted, the whole window reads blocks %v, want the two hours from t0", b)
	}
	check("compacted", whole, cut, [2]time.Duration{0, 2 * time.Hour}, [2]time.Duration{time.Hour, 2 * time.Hour}, [2]time.Duration{0, time.Hour},
		[2]time.Duration{0, 90 * time.Minute}, [2]time.Duration{70 * time.Minute, 3 * time.Hour})
	// Hours that meet at a version or interleave, from their caches;
	// then a version logged an hour out of order, its hour dirty (read
	// raw beside the clean one) and compacted again.
	from := len(s.rows)
	late := lateScenario(s)
	storeWithCopies(t, st, slices.Delete(slices.Clone(s.rows[from:]), late-from, late-from+1), func(int, audit.Row) bool { return false })
	compact()
	storeWithCopies(t, st, s.rows[late:late+1], func(int, audit.Row) bool { return false })
	// The late version's hour is dirty: no block is read, the one built
	// before names the hour's earlier version.
	if b := blocks(0, 3*time.Hour); len(b) != 0 {
		t.Fatalf("late, dirty: the whole window reads blocks %v, want none", b)
	}
	check("late, dirty", whole, cut, [2]time.Duration{time.Hour, 2 * time.Hour})
	compact()
	if b := blocks(0, 3*time.Hour); len(b) != 1 {
		t.Fatalf("late, compacted: the whole window reads blocks %v, want the block built again", b)
	}
	clean := [2]time.Duration{0, 2 * time.Hour} // the clean hours alone: the report reads the interleaved objects first
	check("late, compacted", whole, cut, clean, [2]time.Duration{time.Hour, 2 * time.Hour})
	o := Options{Database: db, Cluster: "c1", Since: t0.Add(clean[0]), Until: t0.Add(clean[1]), History: true}
	if err := o.split(ctx, st.Conn()); err != nil {
		t.Fatal(err)
	}
	// late, and the two whose hours meet at a version shown through the
	// Scale (scaled-noop, scaled-store); joined's hours meet at a whole view.
	if !o.plan.CachesOnly() || !o.plan.InterleavedRead || len(o.plan.Interleaved) != 3 {
		t.Errorf("late, compacted, the clean hours: the plan reads caches only %v, read the interleaved objects %v (%d of 3)",
			o.plan.CachesOnly(), o.plan.InterleavedRead, len(o.plan.Interleaved))
	}

	t.Logf("lost updates by cause: %v", causes)
	for _, c := range []string{"stampless", "laundered_stamp", "forced_apply", "list_replaced"} {
		if causes[c] == 0 {
			t.Errorf("no lost update caused %s: the scenario exercises too little", c)
		}
	}
}

// definitionScenario is the histories of
// TestFieldChangesFollowTheirDefinition.
func definitionScenario() *scenario {
	rnd := rand.New(rand.NewPCG(36, 2))
	s := &scenario{}
	writers := []string{"gitops", "hpa", "alice", "bob", "system:serviceaccount:kube-system:ctl"}
	for _, name := range []string{"a", "b", "c", "d"} {
		version := uint64(1000)
		for i := range 160 {
			version += 1 + rnd.Uint64N(3)
			at := time.Duration(20*i)*time.Second + time.Duration(rnd.IntN(60))*time.Second
			w := randomWrite(rnd, i == 0)
			add := func(at time.Duration, writer string, stamp string) {
				s.add(at, writer, w.verb, "apps", "deployments", "shop", name, w.code, w.logged(version, stamp))
			}
			add(at, writers[rnd.IntN(len(writers))], w.stamp)
			if rnd.IntN(8) == 0 { // a no-op write returns the version, logged after the write that stored it or before
				stamp := w.stamp
				if w.verb == "update" && rnd.IntN(2) == 0 { // sent with the stamp it got back
					stamp = strconv.FormatUint(version, 10)
				}
				add(at+time.Duration(rnd.IntN(120)-30)*time.Second, writers[rnd.IntN(len(writers))], stamp)
			}
		}
	}
	// An object written through its Scale alone after its create: in
	// the second window it has no full view.
	for i := range 60 {
		w := write{verb: "update", code: 200, stamp: "1", paths: []string{"spec.replicas"}, hashes: []uint64{10 + rnd.Uint64N(3)}}
		if i == 0 {
			w = write{verb: "create", code: 201, created: true, full: true, paths: []string{"spec.replicas", "data.a"}, hashes: []uint64{10, 1}}
		} else if rnd.IntN(3) == 0 {
			w.stamp = ""
		}
		s.add(time.Duration(100*i)*time.Second, writers[rnd.IntN(len(writers))], w.verb, "apps", "deployments", "shop", "scaled", w.code, w.logged(uint64(1+i), w.stamp))
	}
	return s
}

// lateScenario adds to s objects whose hours meet at one version or
// interleave: a no-op write of an hour's last version logged in the next
// hour with the whole object (the hours still follow one another),
// through its Scale, or with the whole object of a version stored
// through its Scale (they do not); no-op patches of an hour's last
// version logged in the next hour and of the last version an hour later
// (stitched no-ops: neither echoes its version as a stamp); and a version
// logged in the hour before earlier versions, whose row's index it
// returns (stored last). Their first writes are in t0's hour, their last
// in the next (but the last no-op patch, two hours after t0).
func lateScenario(s *scenario) (late int) {
	return meetingScenario(s, 3, time.Hour, time.Minute, "", []string{"joined", "scaled-noop", "scaled-store", "noops", "late"})
}

// blockEdgeScenario adds to s objects written over both hours of t0's
// block of two hours and the hour after it, whose block and next hour
// meet at one version: the block's last version logged again in the next
// hour with the whole object (joined: the block and the hour still follow
// one another), or stored through the Scale and logged again with the
// whole object (scaled-store: they do not).
func blockEdgeScenario(s *scenario) {
	meetingScenario(s, 4, 2*time.Hour, 4*time.Minute, "edge-", []string{"joined", "scaled-store"})
}

// meetingScenario adds the objects kinds (named prefix and the kind) of
// lateScenario, a version every step, the 20th at hour (after t0); it
// returns the late row's index (when kinds has "late").
func meetingScenario(s *scenario, seed uint64, hour, step time.Duration, prefix string, kinds []string) (late int) {
	rnd := rand.New(rand.NewPCG(36, seed))
	writers := []string{"gitops", "hpa", "alice", "bob"}
	for _, kind := range kinds {
		name := prefix + kind
		var boundary, last write
		for v := uint64(1); v <= 40; v++ {
			w := randomWrite(rnd, v == 1)
			if kind == "scaled-store" && v == 19 {
				w = write{verb: "update", code: 200, stamp: "18", paths: []string{"spec.replicas"}, hashes: []uint64{7}}
			}
			at := hour + (time.Duration(v)-20)*step // v 20 at hour, the hour's first
			switch v {
			case 19:
				boundary = w
			case 40:
				last = w
			}
			if kind == "late" && v == 30 {
				at = hour - 5*time.Minute // before versions 20..29, in the hour before
				late = len(s.rows)
			}
			s.add(at, writers[rnd.IntN(len(writers))], w.verb, "apps", "deployments", "shop", name, w.code, w.logged(v, w.stamp))
		}
		switch kind {
		case "joined": // a no-op write of version 19 in the next hour
			s.add(hour+30*time.Second, "alice", "update", "apps", "deployments", "shop", name, 200, boundary.logged(19, "19"))
		case "scaled-store": // version 19 stored through the Scale, its no-op write in the next hour shows the whole object
			noop := randomWrite(rnd, false)
			noop.verb, noop.full, noop.stamp = "update", true, "19"
			s.add(hour+30*time.Second, "alice", "update", "apps", "deployments", "shop", name, 200, noop.logged(19, "19"))
		case "noops": // no-op patches of version 19 in the next hour, and of version 40 (at hour + 20 steps) in the hour after it
			s.add(hour+30*time.Second, "bob", "patch", "apps", "deployments", "shop", name, 200, boundary.logged(19, ""))
			s.add(hour+70*time.Minute, "gitops", "patch", "apps", "deployments", "shop", name, 200, last.logged(40, ""))
		case "scaled-noop":
			noop := write{verb: "update", code: 200, stamp: "19", paths: []string{"spec.replicas"}, hashes: []uint64{7}}
			for i, p := range boundary.paths {
				if p == "spec.replicas" {
					noop.hashes[0] = boundary.hashes[i]
				}
			}
			s.add(hour+30*time.Second, "hpa", "update", "apps", "deployments", "shop", name, 200, noop.logged(19, "19"))
		}
	}
	return late
}

// write is one write of TestFieldChangesFollowTheirDefinition.
type write struct {
	verb, stamp, manager                 string
	code                                 int32
	created, full, managed, force, apply bool
	paths                                []string
	hashes                               []uint64
}

// logged sets a row to w, logged with its response: the version it
// stored and the stamp it sent.
func (w write) logged(version uint64, stamp string) func(*audit.Row) {
	return func(r *audit.Row) {
		r.Level, r.ObjectVersion, r.Created, r.FullView = "RequestResponse", version, w.created, w.full
		r.Stamp, r.FieldManager, r.RequestManaged, r.Force, r.Apply = stamp, w.manager, w.managed, w.force, w.apply
		r.Fields = audit.Fields{Paths: slices.Clone(w.paths), Hashes: slices.Clone(w.hashes)}
		if !w.full {
			r.Subresource = "scale"
		}
	}
}

// storeWithCopies stores rows, then a second time those again keeps
// (a redelivery): every finding must count them once.
func storeWithCopies(t *testing.T, st *store.Store, rows []audit.Row, again func(i int, r audit.Row) bool) {
	t.Helper()
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	var copies []audit.Row
	for i, r := range rows {
		if again(i, r) {
			copies = append(copies, r)
		}
	}
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(copies, nil)); err != nil {
		t.Fatal(err)
	}
}

// randomWrite draws a write: the object's create, a Scale update, or a
// full view on any basis, its fields drawn from small sets of values.
func randomWrite(rnd *rand.Rand, create bool) write {
	w := write{verb: "update", code: 200, full: true, stamp: "1", managed: true}
	switch k := rnd.IntN(9); {
	case create:
		w.verb, w.code, w.created = "create", 201, true
	case k == 0:
		w.full = false
		w.paths, w.hashes = []string{"spec.replicas"}, []uint64{10 + rnd.Uint64N(3)}
		return w
	case k == 1:
		w.stamp = ""
	case k == 2:
		w.manager, w.managed = "kubectl-replace", false
	case k == 3:
		w.verb, w.apply, w.force = "patch", true, true
	case k == 4:
		w.verb, w.apply = "patch", true
	case k == 5, k == 6:
		w.verb = "patch"
	}
	single := []string{"spec.replicas", "data.a", `metadata.labels["team"]`, "spec.template.spec.containers[name=app].image"}
	for _, p := range single {
		if rnd.IntN(4) != 0 {
			w.paths, w.hashes = append(w.paths, p), append(w.hashes, 1+rnd.Uint64N(3))
		}
	}
	// Set-like lists: items in any order, one may repeat.
	for _, p := range []string{"metadata.finalizers[*]", "spec.template.spec.containers[name=app].args[*]"} {
		for range rnd.IntN(4) {
			w.paths, w.hashes = append(w.paths, p), append(w.hashes, 100+rnd.Uint64N(3))
		}
	}
	rnd.Shuffle(len(w.paths), func(i, j int) {
		w.paths[i], w.paths[j] = w.paths[j], w.paths[i]
		w.hashes[i], w.hashes[j] = w.hashes[j], w.hashes[i]
	})
	return w
}

// changesOf computes the lost updates and the field writers of rows in
// [since, until) by their definition (analytics/sql, history.go): an
// object's versions are its history rows, one per version (the earliest
// write that stored it); a field's known values are its hashes at each
// version that shows it, none at a full view that does not; a version
// sets the field when it created the object or its value differs from
// the known value before it (the window's first is not a change); a
// set's change replaced the set before it.
func changesOf(rows []audit.Row, since, until time.Time) ([]LostUpdate, []FieldWriter) {
	type version struct {
		row    audit.Row
		basis  string
		fields map[string][]uint64
	}
	objects := map[string]map[uint64]version{}
	for _, r := range rows {
		if r.ObjectVersion == 0 || r.StageMicros < since.UnixMicro() || r.StageMicros >= until.UnixMicro() {
			continue
		}
		if objects[r.Name] == nil {
			objects[r.Name] = map[uint64]version{}
		}
		if v, ok := objects[r.Name][r.ObjectVersion]; ok && (v.row.StageMicros < r.StageMicros || v.row.StageMicros == r.StageMicros && v.row.AuditID <= r.AuditID) {
			continue
		}
		v := version{row: r, basis: basisOf(r), fields: map[string][]uint64{}}
		for i, p := range r.Fields.Paths {
			v.fields[p] = append(v.fields[p], r.Fields.Hashes[i])
		}
		for _, hs := range v.fields {
			slices.Sort(hs)
		}
		objects[r.Name][r.ObjectVersion] = v
	}
	var lost []LostUpdate
	type writerKey struct{ field, writer string }
	type writerRow struct {
		changes     uint64
		names       map[string]bool
		first, last int64
	}
	byWriter := map[writerKey]*writerRow{}
	for name, versions := range objects {
		order := slices.Sorted(maps.Keys(versions))
		fields := map[string]bool{}
		for _, v := range versions {
			for p := range v.fields {
				fields[p] = true
			}
		}
		for field := range fields {
			type entry struct {
				v    version
				vals []uint64
			}
			var known []entry
			for _, n := range order {
				v := versions[n]
				if hs, ok := v.fields[field]; ok {
					known = append(known, entry{v, hs})
				} else if v.row.FullView {
					known = append(known, entry{v, nil})
				}
			}
			var prev, prevBefore []uint64
			var prevSet *entry
			for i := range known {
				e := &known[i]
				sets := e.v.basis == "create" || i > 0 && !slices.Equal(e.vals, known[i-1].vals)
				if !sets {
					continue
				}
				var before []uint64
				if i > 0 {
					before = known[i-1].vals
				}
				if e.v.basis != "create" {
					prevWriter, prevID, prevAt := "", "", int64(0)
					if prevSet != nil {
						prevWriter, prevID, prevAt = prevSet.v.row.Writer(), prevSet.v.row.AuditID, prevSet.v.row.StageMicros
					}
					removedAdded := slices.ContainsFunc(prev, func(h uint64) bool { return !slices.Contains(e.vals, h) && !slices.Contains(prevBefore, h) })
					itemRemoved := strings.Contains(field, "[name=") && len(e.vals) == 0 && len(prev) > 0
					cause := ""
					switch {
					case prevWriter == "" || prevWriter == e.v.row.Writer():
					case e.v.basis == "stampless" || e.v.basis == "laundered_stamp" || e.v.basis == "forced_apply":
						cause = e.v.basis
					case e.v.basis == "patch" && (strings.HasSuffix(field, "[*]") && removedAdded || itemRemoved):
						cause = "list_replaced"
					}
					if cause != "" {
						lost = append(lost, LostUpdate{APIGroup: "apps", Resource: "deployments", Namespace: "shop", Name: name, Field: field,
							Writer: e.v.row.Writer(), OverwrittenWriter: prevWriter, Cause: cause, AuditID: e.v.row.AuditID, OverwrittenAuditID: prevID,
							Time: microsTime(uint64(e.v.row.StageMicros)), OverwrittenTime: microsTime(uint64(prevAt))})
					}
					k := writerKey{field, e.v.row.Writer()}
					w := byWriter[k]
					if w == nil {
						w = &writerRow{names: map[string]bool{}, first: e.v.row.StageMicros, last: e.v.row.StageMicros}
						byWriter[k] = w
					}
					w.changes++
					w.names[name] = true
					w.first, w.last = min(w.first, e.v.row.StageMicros), max(w.last, e.v.row.StageMicros)
				}
				prev, prevBefore, prevSet = e.vals, before, e
			}
		}
	}
	var writers []FieldWriter
	for k, w := range byWriter {
		writers = append(writers, FieldWriter{APIGroup: "apps", Resource: "deployments", Namespace: "shop", Field: k.field, Writer: k.writer,
			Changes: w.changes, Objects: uint64(len(w.names)), First: microsTime(uint64(w.first)), Last: microsTime(uint64(w.last))})
	}
	return lost, writers
}

// noopsOf counts the no-op writes of rows in [since, until) per writer,
// by their definition (analytics/sql, NoopWrites): of the writes of one
// version of an object, each identity once, every one but the earliest,
// and an update sent with the stamp of the version it got back.
func noopsOf(rows []audit.Row, since, until time.Time) []NoopWrites {
	type key struct {
		name    string
		version uint64
	}
	versions := map[key][]audit.Row{}
	seen := map[string]bool{}
	for _, r := range rows {
		id := r.AuditID + "/" + strconv.FormatUint(r.Fingerprint, 10)
		if r.ObjectVersion == 0 || seen[id] || r.StageMicros < since.UnixMicro() || r.StageMicros >= until.UnixMicro() {
			continue
		}
		seen[id] = true
		k := key{r.Name, r.ObjectVersion}
		versions[k] = append(versions[k], r)
	}
	counts := map[string]uint64{}
	for k, ws := range versions {
		slices.SortFunc(ws, func(a, b audit.Row) int {
			return cmp.Or(cmp.Compare(a.StageMicros, b.StageMicros), cmp.Compare(a.AuditID, b.AuditID))
		})
		for i, w := range ws {
			if i > 0 || w.Verb == "update" && w.Stamp == strconv.FormatUint(k.version, 10) {
				counts[w.Writer()]++
			}
		}
	}
	var noops []NoopWrites
	for w, n := range counts {
		noops = append(noops, NoopWrites{User: w, Count: n})
	}
	return noops
}

// basisOf is analytics/sql's WriteBasis of a row.
func basisOf(r audit.Row) string {
	switch {
	case r.Created:
		return "create"
	case r.Verb == "update" && r.Stamp == "":
		return "stampless"
	case r.Verb == "update" && r.FieldManager == "kubectl-replace" && !r.RequestManaged:
		return "laundered_stamp"
	case r.Verb == "patch" && r.Force:
		return "forced_apply"
	case r.Verb == "patch" && !r.Apply:
		return "patch"
	}
	return ""
}

// set holds xs as a set of their printed forms.
func set[T any](xs []T) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[fmt.Sprintf("%+v", x)] = true
	}
	return m
}
