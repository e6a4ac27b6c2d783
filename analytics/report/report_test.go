package report

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

const optimistic = `Operation cannot be fulfilled on configmaps "a": the object has been modified; please apply your changes to the latest version and try again`

var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

// scenario writes audit rows the way the sink stores them.
type scenario struct {
	rows []audit.Row
	n    int
}

func (s *scenario) add(at time.Duration, user, verb, group, resource, ns, name string, code int32, mod func(*audit.Row)) {
	s.n++
	r := audit.Row{
		Cluster: "c1", AuditID: fmt.Sprintf("id-%04d", s.n), Stage: audit.StageResponseComplete, Level: "Request",
		Verb: verb, User: user, APIGroup: group, APIVersion: "v1", Resource: resource, Namespace: ns, Name: name,
		Code: code, RequestReceivedMicros: t0.Add(at).UnixMicro() - 500, StageMicros: t0.Add(at).UnixMicro(),
		RequestURI: "/api/v1/" + resource,
	}
	if code == 409 {
		r.Reason, r.Message = "Conflict", optimistic
	}
	if mod != nil {
		mod(&r)
	}
	r.Fingerprint = audit.Fingerprint(&r)
	s.rows = append(s.rows, r)
}

func conflicts(s *scenario, user, ns, name string, from time.Duration, n int, step time.Duration) {
	for i := range n {
		s.add(from+time.Duration(i)*step, user, "update", "", "configmaps", ns, name, 409, nil)
	}
}

func buildScenario() *scenario {
	s := &scenario{}
	sec := time.Second
	// Read-modify-write contention on cm/a, resolved.
	s.add(1*sec, "alice", "update", "", "configmaps", "shop", "a", 200, func(r *audit.Row) { r.Stamp = "1" })
	s.add(2*sec, "bob", "update", "", "configmaps", "shop", "a", 409, func(r *audit.Row) { r.Stamp = "1" })
	s.add(3*sec, "bob", "update", "", "configmaps", "shop", "a", 200, func(r *audit.Row) { r.Stamp = "2" })
	// carol is stuck: six conflicts, never a success.
	for i := range 6 {
		s.add(time.Duration(10+10*i)*sec, "carol", "update", "apps", "deployments", "shop", "web", 409, nil)
	}
	// dave loops five times, then succeeds.
	conflicts(s, "dave", "shop", "b", 100*sec, 5, sec)
	s.add(110*sec, "dave", "update", "", "configmaps", "shop", "b", 200, func(r *audit.Row) { r.Stamp = "9" })
	// erin: three conflicts are no loop.
	conflicts(s, "erin", "shop", "c", 120*sec, 3, sec)
	// gina: 3 + 3 conflicts split by a ten-minute gap are two short runs.
	conflicts(s, "gina", "shop", "g", 130*sec, 3, sec)
	conflicts(s, "gina", "shop", "g", 130*sec+10*time.Minute, 3, sec)
	// frank overwrites blindly twice; one more blind write was impersonated.
	s.add(200*sec, "frank", "update", "", "configmaps", "shop", "d", 200, nil)
	s.add(201*sec, "frank", "update", "", "configmaps", "shop", "d", 200, nil)
	s.add(202*sec, "admin", "update", "", "configmaps", "shop", "d", 200, func(r *audit.Row) { r.ImpersonatedUser = "frank" })
	// Server-side apply field conflict, create of an existing name, stale
	// uid precondition, another webhook's 409, an expired list.
	s.add(210*sec, "alice", "patch", "", "configmaps", "shop", "a", 409, func(r *audit.Row) {
		r.Message, r.CauseReasons, r.CauseFields = `Apply failed with 1 conflict: conflict with "bob": .data.x`, []string{"FieldManagerConflict"}, []string{".data.x"}
	})
	s.add(211*sec, "alice", "create", "", "configmaps", "shop", "a", 409, func(r *audit.Row) {
		r.Reason, r.Message = "AlreadyExists", `configmaps "a" already exists`
	})
	s.add(212*sec, "alice", "delete", "", "configmaps", "shop", "e", 409, func(r *audit.Row) {
		r.Message = `Operation cannot be fulfilled on configmaps "e": the UID in the precondition (1) does not match the UID in record (2). The object might have been deleted and then recreated`
	})
	s.add(213*sec, "alice", "update", "", "configmaps", "shop", "f", 409, func(r *audit.Row) { r.Message = "denied by quota-webhook" })
	s.add(214*sec, "alice", "list", "", "configmaps", "shop", "", 410, func(r *audit.Row) {
		r.Reason, r.Message = "Expired", "The resourceVersion for the provided list is too old."
	})
	// A lease changes hands A -> B -> A; renewals, a release to "" and
	// re-acquiring by the same holder are not changes.
	for i, h := range []string{"A", "A", "B", "", "B", "A"} {
		verb := "update"
		if i == 0 {
			verb = "create"
		}
		s.add(time.Duration(300+i)*sec, "system:kube-scheduler", verb, "coordination.k8s.io", "leases", "kube-system", "kube-scheduler", 200,
			func(r *audit.Row) { r.LeaseHolder, r.Stamp = h, fmt.Sprint(i) })
	}
	// stampguard decisions.
	s.add(400*sec, "alice", "update", "apps", "deployments", "shop", "web", 403, func(r *audit.Row) {
		r.Reason, r.Stamp = "Forbidden", "5"
		r.AnnotationKeys = []string{"fields.stampguard.dev/field-owner", "authorization.k8s.io/decision"}
		r.AnnotationValues = []string{`[{"policy":"deployments","rule":"fieldOwners[0]","action":"Deny","path":"spec.replicas","writer":"alice"}]`, "allow"}
	})
	s.add(401*sec, "frank", "update", "", "configmaps", "shop", "d", 200, func(r *audit.Row) {
		r.AnnotationKeys = []string{"stamp.stampguard.dev/stamp-missing"}
		r.AnnotationValues = []string{`[{"policy":"a","rule":"requireResourceVersion","action":"Warn","path":"metadata.resourceVersion","writer":"frank"},{"policy":"b","rule":"requireResourceVersion","action":"Audit","path":"metadata.resourceVersion","writer":"frank"}]`}
	})
	// Not counted: a review API create (a request, not a write attempt) ...
	s.add(500*sec, "alice", "create", "authorization.k8s.io", "subjectaccessreviews", "", "", 201, nil)
	// ... and, not even as requests: a dry run, another stage, another
	// cluster, and an event outside the window.
	s.add(501*sec, "alice", "update", "", "configmaps", "shop", "a", 409, func(r *audit.Row) { r.DryRun = true })
	s.add(502*sec, "alice", "update", "", "configmaps", "shop", "a", 409, func(r *audit.Row) { r.Stage = audit.StageRequestReceived })
	s.add(503*sec, "alice", "update", "", "configmaps", "shop", "a", 409, func(r *audit.Row) { r.Cluster = "c2" })
	s.add(2*time.Hour, "alice", "update", "", "configmaps", "shop", "a", 409, nil)
	return s
}

func us(d time.Duration) string { return t0.Add(d).Format(TimeFormat) }

func TestBuild(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	srv := chtest.Start(t)
	db := srv.NewDatabase(t)
	ctx := t.Context()
	store, err := store.Open(ctx, store.Options{DSN: srv.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	opts := Options{Database: db, Cluster: "c1", Since: t0, Until: t0.Add(time.Hour), Top: 20}

	t.Run("an empty window says so", func(t *testing.T) {
		r, err := Build(ctx, store.Conn(), opts)
		if !errors.Is(err, ErrNoEvents) || r == nil || r.Totals.Requests != 0 {
			t.Fatalf("got %+v, %v", r, err)
		}
	})

	s := buildScenario()
	rows := append([]audit.Row(nil), s.rows...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	// Out of order, and every row twice: the store keeps each once.
	for _, batch := range [][]audit.Row{rows[:len(rows)/2], rows[len(rows)/2:], rows} {
		if _, err := store.InsertRecords(ctx, recordtest.Set(batch, nil)); err != nil {
			t.Fatal(err)
		}
	}

	r, err := Build(ctx, store.Conn(), opts)
	if err != nil {
		t.Fatal(err)
	}
	want := Totals{
		Requests: 41, WriteAttempts: 39, VersionConflicts: 21, FieldConflicts: 1, AlreadyExists: 1,
		DeletePreconditionConflicts: 1, StamplessUpdates: 4, OtherConflicts: 1, Gone: 1,
	}
	want.ConflictRate = float64(want.VersionConflicts) / float64(want.WriteAttempts)
	if r.Totals != want {
		t.Errorf("totals\n got %+v\nwant %+v", r.Totals, want)
	}
	wantLoops := []RetryLoop{
		{User: "carol", APIGroup: "apps", Resource: "deployments", Namespace: "shop", Name: "web", Conflicts: 6, First: us(10 * time.Second), Last: us(60 * time.Second), Resolved: false},
		{User: "dave", Resource: "configmaps", Namespace: "shop", Name: "b", Conflicts: 5, First: us(100 * time.Second), Last: us(104 * time.Second), Resolved: true},
	}
	if fmt.Sprint(r.RetryLoops) != fmt.Sprint(wantLoops) {
		t.Errorf("retry loops\n got %+v\nwant %+v", r.RetryLoops, wantLoops)
	}
	wantLeases := []LeaseChanges{{Namespace: "kube-system", Name: "kube-scheduler", Changes: 2, Holders: []string{"A", "B", "A"}}}
	if fmt.Sprint(r.LeaseHolderChanges) != fmt.Sprint(wantLeases) {
		t.Errorf("lease changes\n got %+v\nwant %+v", r.LeaseHolderChanges, wantLeases)
	}
	wantStampless := []StamplessUpdates{{User: "frank", Resource: "configmaps", Namespace: "shop", Name: "d", Count: 4}}
	if fmt.Sprint(r.StamplessUpdates) != fmt.Sprint(wantStampless) {
		t.Errorf("stampless\n got %+v\nwant %+v", r.StamplessUpdates, wantStampless)
	}
	wantDecisions := []PolicyDecisions{
		{Policy: "a", Kind: "stamp-missing", Action: "warn", Count: 1},
		{Policy: "b", Kind: "stamp-missing", Action: "audit", Count: 1},
		{Policy: "deployments", Kind: "field-owner", Action: "deny", Count: 1},
	}
	if fmt.Sprint(r.PolicyDecisions) != fmt.Sprint(wantDecisions) {
		t.Errorf("policy decisions\n got %+v\nwant %+v", r.PolicyDecisions, wantDecisions)
	}
	if len(r.HotObjects) == 0 || r.HotObjects[0].Name != "web" || r.HotObjects[0].VersionConflicts != 6 || r.HotObjects[0].DistinctWriters != 2 {
		t.Errorf("hot objects: %+v", r.HotObjects)
	}
	if len(r.ConflictsByUser) == 0 || r.ConflictsByUser[0].User != "carol" {
		t.Errorf("conflicts by user: %+v", r.ConflictsByUser)
	}

	t.Run("a window cutting a loop in half sees only its part", func(t *testing.T) {
		o := opts
		o.Since = t0.Add(35 * time.Second) // carol's conflicts at 40, 50, 60 remain: below the threshold
		half, err := Build(ctx, store.Conn(), o)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range half.RetryLoops {
			if l.User == "carol" {
				t.Fatalf("carol's loop survived the cut: %+v", l)
			}
		}
	})
	t.Run("filters narrow every section", func(t *testing.T) {
		o := opts
		o.User = "carol"
		only, err := Build(ctx, store.Conn(), o)
		if err != nil {
			t.Fatal(err)
		}
		if only.Totals.Requests != 6 || len(only.ConflictsByUser) != 1 || len(only.RetryLoops) != 1 {
			t.Fatalf("got %+v", only)
		}
	})
	// Last: it drops the events. A clean hour is read from its caches:
	// the report over whole hours still finds the loops without events,
	// and the raw path, which reads events alone, finds none.
	t.Run("clean hours are read from their caches", func(t *testing.T) {
		compact(t, store)
		o := opts
		o.Since = o.Since.Truncate(time.Hour)
		o.Until = o.Since.Add(4 * time.Hour)
		cached, err := Build(ctx, store.Conn(), o)
		if err != nil {
			t.Fatal(err)
		}
		if len(cached.RetryLoops) == 0 {
			t.Fatal("no retry loop over the scenario's hours")
		}
		if err := store.Conn().Exec(ctx, "ALTER TABLE "+db+".events_by_hour DROP PARTITION '2026-11-29'"); err != nil {
			t.Fatal(err)
		}
		again, err := Build(ctx, store.Conn(), o)
		if err != nil {
			t.Fatal(err)
		}
		// Lease holders, policy decisions and conflict causes are read
		// from events alone.
		for _, r := range []*Report{cached, again} {
			r.LeaseHolderChanges, r.PolicyDecisions, r.ConflictCauses = nil, nil, nil
		}
		if fmt.Sprint(again) != fmt.Sprint(cached) {
			t.Errorf("without events the cached hours say\n%+v\nwith them\n%+v", again, cached)
		}
		o.NoRollup = true
		raw, err := Build(ctx, store.Conn(), o)
		if !errors.Is(err, ErrNoEvents) || len(raw.RetryLoops) != 0 {
			t.Errorf("the raw path without events: %v, %d loops", err, len(raw.RetryLoops))
		}
	})
}

func TestWriteTableFitsAndSaysWhenEmpty(t *testing.T) {
	var b strings.Builder
	o := Options{Cluster: "prod", Since: t0, Until: t0.Add(time.Hour)}
	if err := WriteTable(&b, &Report{Window: Window{Since: t0.Format(TimeFormat), Until: t0.Add(time.Hour).Format(TimeFormat)}}, o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "No requests were recorded in this window") || strings.Contains(b.String(), "HOT OBJECTS") {
		t.Fatalf("empty report:\n%s", b.String())
	}
	b.Reset()
	long := strings.Repeat("x", 200)
	r := &Report{
		Window:     Window{Since: t0.Format(TimeFormat), Until: t0.Add(time.Hour).Format(TimeFormat)},
		Totals:     Totals{Requests: 10, WriteAttempts: 8, VersionConflicts: 6, ConflictRate: 0.75},
		RetryLoops: []RetryLoop{{User: long, Resource: "configmaps", Namespace: long, Name: long, Conflicts: 6, First: t0.Format(TimeFormat), Last: t0.Format(TimeFormat)}},
		HotObjects: []HotObject{{Resource: "configmaps", Namespace: "shop", Name: "a", VersionConflicts: 6, DistinctWriters: 2, WriteAttempts: 8}},
	}
	if err := WriteTable(&b, r, o); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"UNRESOLVED RETRY LOOPS", "HOT OBJECTS", "conflict rate 75.00%", "configmaps shop/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "UNRESOLVED RETRY LOOPS") > strings.Index(out, "HOT OBJECTS") {
		t.Error("unresolved loops must come first")
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > tableWidth {
			t.Errorf("line of %d columns: %q", len(line), line)
		}
	}
}

// TestSegmentsFirst checks the order in which a report starts its
// queries: those that read the field history's segments first, each
// group in the order given.
func TestSegmentsFirst(t *testing.T) {
	runs := []run{{query: QueryTotals}, {query: QueryLostUpdates}, {query: QueryHotObjects}, {query: QueryFieldWriters}, {query: QueryNoopWrites}, {query: QueryRetryLoops}}
	var got []string
	for _, i := range segmentsFirst(runs) {
		got = append(got, runs[i].query.Name)
	}
	want := []string{"lost_updates", "field_writers", "noop_writes", "totals", "hot_objects", "retry_loops"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}
