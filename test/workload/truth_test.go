package workload

import (
	"slices"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

const modified = `Operation cannot be fulfilled on configmaps "x": ` + optimisticLockMessage

// seq builds requests one millisecond apart, in order, with Audit-Ids "a", "b", ...
func seq(rs ...Request) []Request {
	out := make([]Request, len(rs))
	for i, r := range rs {
		r.Start = t0.Add(time.Duration(i) * time.Millisecond)
		r.AuditID = string(rune('a' + i))
		if r.Resource == "" {
			r.Resource = "configmaps"
		}
		if r.Namespace == "" {
			r.Namespace = "ns"
		}
		if r.Name == "" && r.Verb != "list" {
			r.Name = "x"
		}
		out[i] = r
	}
	return out
}

func conflict(w string) Request {
	return Request{Writer: w, Verb: "update", Code: 409, Reason: "Conflict", Message: modified, Stamp: "1"}
}
func ok(w string) Request  { return Request{Writer: w, Verb: "update", Code: 200, Stamp: "1"} }
func get(w string) Request { return Request{Writer: w, Verb: "get", Code: 200} }

func repeat(n int, r Request) []Request {
	out := make([]Request, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func cat(parts ...[]Request) []Request { return slices.Concat(parts...) }

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name string
		r    Request
		want Kind
	}{
		{"a stale update is a version conflict", conflict("a"), KindVersionConflict},
		{"an apply conflict is a field conflict", Request{Verb: "patch", Code: 409, Reason: "Conflict",
			Message: `Apply failed with 1 conflict: conflict with "alice-tool": .data.x`, Causes: []string{"FieldManagerConflict"}}, KindFieldConflict},
		{"a create of an existing name is already exists", Request{Verb: "create", Code: 409, Reason: "AlreadyExists", Message: `configmaps "x" already exists`}, KindAlreadyExists},
		{"a delete with a stale uid is a delete precondition conflict", Request{Verb: "delete", Code: 409, Reason: "Conflict",
			Message: `Operation cannot be fulfilled on ConfigMap "x": the UID in the precondition (1) does not match the UID in record (2). The object might have been deleted and then recreated`}, KindDeletePrecondition},
		{"a webhook's 409 is another conflict", Request{Verb: "update", Code: 409, Reason: "Conflict", Message: `admission webhook "w" denied the request`}, KindOtherConflict},
		{"an expired list is gone", Request{Verb: "list", Code: 410, Reason: "Expired"}, KindGone},
		{"a success is nothing", ok("a"), KindNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Classify(c.r); got != c.want {
				t.Errorf("Classify = %v, want %v", got, c.want)
			}
		})
	}
}

func TestTruthTotals(t *testing.T) {
	reqs := seq(
		Request{Writer: "ci", Verb: "create", Code: 201},
		Request{Writer: "ci", Verb: "update", Code: 200},               // stampless
		Request{Writer: "ci", Verb: "update", Code: 200, DryRun: true}, // dry runs never count
		Request{Writer: "ci", Verb: "update", Code: 409, DryRun: true, Reason: "Conflict", Message: modified},
		conflict("bob"),
		Request{Writer: "bob", Verb: "list", Code: 410, Reason: "Expired"},
		Request{Writer: "bob", Verb: "create", APIGroup: "authorization.k8s.io", Resource: "subjectaccessreviews", Code: 201},
	)
	rep, _ := Truth(reqs, t0, t0.Add(time.Hour), LoopOptions{})
	want := report.Totals{Requests: 5, WriteAttempts: 3, VersionConflicts: 1, StamplessUpdates: 1, Gone: 1, ConflictRate: 1.0 / 3}
	if rep.Totals != want {
		t.Errorf("totals\n got %+v\nwant %+v", rep.Totals, want)
	}
	wantUsers := []report.UserConflicts{{User: "bob", WriteAttempts: 1, VersionConflicts: 1}, {User: "ci", WriteAttempts: 2}}
	if !slices.Equal(rep.ConflictsByUser, wantUsers) {
		t.Errorf("conflicts by user\n got %+v\nwant %+v", rep.ConflictsByUser, wantUsers)
	}
	if rep.Window.Since != "2026-11-29T10:00:00.000000Z" || rep.Window.Until != "2026-11-29T11:00:00.000000Z" {
		t.Errorf("window %+v", rep.Window)
	}
}

func TestTruthWindowIsHalfOpen(t *testing.T) {
	reqs := seq(ok("a"), ok("a"), ok("a"))
	rep, _ := Truth(reqs, reqs[1].Start, reqs[2].Start, LoopOptions{})
	if rep.Totals.Requests != 1 {
		t.Errorf("requests in [second, third) = %d, want 1", rep.Totals.Requests)
	}
}

func TestTruthEmpty(t *testing.T) {
	rep, bounds := Truth(nil, t0, t0.Add(time.Hour), LoopOptions{})
	if rep.ConflictsByUser == nil || rep.HotObjects == nil || rep.RetryLoops == nil || rep.LeaseHolderChanges == nil || rep.PolicyDecisions == nil || len(bounds) != 0 {
		t.Errorf("an empty truth must have empty, non-nil lists: %+v", rep)
	}
}

func TestRetryLoops(t *testing.T) {
	type loop struct {
		user      string
		conflicts uint64
		resolved  bool
	}
	for _, c := range []struct {
		name string
		reqs []Request
		want []loop
	}{
		{"five conflicts in a row are an unresolved loop", repeat(5, conflict("a")), []loop{{"a", 5, false}}},
		{"four conflicts are not a loop", cat(repeat(4, conflict("a"))), nil},
		{"a success after the run resolves it", cat(repeat(5, conflict("a")), []Request{get("a"), ok("a")}), []loop{{"a", 5, true}}},
		{"a read does not break the run", cat(repeat(3, conflict("a")), []Request{get("a")}, repeat(3, conflict("a"))), []loop{{"a", 6, false}}},
		{"a success in between splits the run", cat(repeat(3, conflict("a")), []Request{ok("a")}, repeat(3, conflict("a"))), nil},
		{"another writer's success neither breaks nor resolves", cat(repeat(3, conflict("a")), []Request{ok("b")}, repeat(3, conflict("a"))), []loop{{"a", 6, false}}},
		{"two writers loop apart, longer first", cat(repeat(5, conflict("b")), repeat(6, conflict("a")), []Request{ok("b")}),
			[]loop{{"a", 6, false}, {"b", 5, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, bounds := Truth(seq(c.reqs...), t0, t0.Add(time.Hour), LoopOptions{})
			var got []loop
			for _, l := range rep.RetryLoops {
				got = append(got, loop{l.User, l.Conflicts, l.Resolved})
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("loops\n got %+v\nwant %+v", got, c.want)
			}
			if len(bounds) != len(rep.RetryLoops) {
				t.Errorf("%d bounds for %d loops", len(bounds), len(rep.RetryLoops))
			}
		})
	}
}

func TestRetryLoopGapAndBounds(t *testing.T) {
	reqs := seq(repeat(10, conflict("a"))...)
	for i := 5; i < 10; i++ {
		reqs[i].Start = reqs[i].Start.Add(6 * time.Minute)
	}
	rep, bounds := Truth(reqs, t0, t0.Add(time.Hour), LoopOptions{})
	if len(rep.RetryLoops) != 2 {
		t.Fatalf("a 6m pause must split 10 conflicts into two loops: %+v", rep.RetryLoops)
	}
	if rep.RetryLoops[0].First != "2026-11-29T10:00:00.000000Z" || rep.RetryLoops[0].Last != "2026-11-29T10:00:00.004000Z" {
		t.Errorf("first loop spans %s .. %s", rep.RetryLoops[0].First, rep.RetryLoops[0].Last)
	}
	if bounds[0] != (LoopBounds{FirstAuditID: reqs[0].AuditID, LastAuditID: reqs[4].AuditID}) ||
		bounds[1] != (LoopBounds{FirstAuditID: reqs[5].AuditID, LastAuditID: reqs[9].AuditID}) {
		t.Errorf("bounds %+v", bounds)
	}
	rep, _ = Truth(reqs, t0, t0.Add(time.Hour), LoopOptions{Gap: 10 * time.Minute})
	if len(rep.RetryLoops) != 1 || rep.RetryLoops[0].Conflicts != 10 {
		t.Errorf("with --loop-gap 10m the pause is inside one loop: %+v", rep.RetryLoops)
	}
}

func TestLeaseHolderChanges(t *testing.T) {
	lease := func(w, holder string, code int) Request {
		h := holder
		return Request{Writer: w, Verb: "update", APIGroup: "coordination.k8s.io", Resource: "leases", Name: "l", Code: code, Stamp: "1", Holder: &h}
	}
	create := lease("a", "a", 201)
	create.Verb = "create"
	rep, _ := Truth(seq(
		create,               // first holder: not a change
		lease("a", "a", 200), // renewal
		lease("b", "b", 200), // takeover: a change
		lease("a", "a", 409), // a's stale renewal fails: not a holder
		lease("b", "", 200),  // release: not a change
		lease("b", "b", 200), // same holder again: not a change
		lease("b", "", 200),
		lease("a", "a", 200), // a change
	), t0, t0.Add(time.Hour), LoopOptions{})
	want := []report.LeaseChanges{{Namespace: "ns", Name: "l", Changes: 2, Holders: []string{"a", "b", "a"}}}
	if len(rep.LeaseHolderChanges) != 1 || rep.LeaseHolderChanges[0].Changes != 2 || !slices.Equal(rep.LeaseHolderChanges[0].Holders, want[0].Holders) {
		t.Errorf("lease changes\n got %+v\nwant %+v", rep.LeaseHolderChanges, want)
	}
	rep, _ = Truth(seq(create, lease("a", "a", 200)), t0, t0.Add(time.Hour), LoopOptions{})
	if len(rep.LeaseHolderChanges) != 0 {
		t.Errorf("a lease that never changed hands is not listed: %+v", rep.LeaseHolderChanges)
	}
}

func TestHotObjectOrder(t *testing.T) {
	on := func(r Request, name string) Request { r.Name = name; return r }
	rep, _ := Truth(seq(
		on(ok("a"), "calm"), on(ok("a"), "calm"), on(ok("a"), "calm"),
		on(ok("a"), "shared"), on(ok("b"), "shared"),
		on(conflict("a"), "hot"),
	), t0, t0.Add(time.Hour), LoopOptions{})
	var names []string
	for _, o := range rep.HotObjects {
		names = append(names, o.Name)
	}
	// conflicts first, then distinct writers, then attempts.
	if want := []string{"hot", "shared", "calm"}; !slices.Equal(names, want) {
		t.Errorf("hot objects %v, want %v", names, want)
	}
}
