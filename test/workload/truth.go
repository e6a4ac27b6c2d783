package workload

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
)

// TimeFormat is how the report writes instants: RFC3339 with microseconds, UTC.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// The apiserver's messages that tell conflicts apart (issue 4, "Definitions").
const (
	optimisticLockMessage = "the object has been modified; please apply your changes to the latest version and try again"
	fieldManagerConflict  = "FieldManagerConflict"
)

// LoopOptions are `auditsink report`'s --loop-gap and --loop-threshold.
type LoopOptions struct {
	// Gap is the longest pause inside a retry loop. Defaults to 5m.
	Gap time.Duration
	// Threshold is the fewest version conflicts that make a loop. Defaults to 5.
	Threshold int
}

func (o *LoopOptions) setDefaults() {
	if o.Gap == 0 {
		o.Gap = 5 * time.Minute
	}
	if o.Threshold == 0 {
		o.Threshold = 5
	}
}

// Kind is how one request counts in the report.
type Kind int

// The kinds of a 409 are exclusive and checked in this order: a field
// conflict, a version conflict, already exists, a delete precondition
// conflict, and any other 409.
const (
	KindNone Kind = iota
	KindVersionConflict
	KindFieldConflict
	KindAlreadyExists
	KindDeletePrecondition
	KindOtherConflict
	KindGone
)

func (k Kind) String() string {
	switch k {
	case KindVersionConflict:
		return "version conflict"
	case KindFieldConflict:
		return "field conflict"
	case KindAlreadyExists:
		return "already exists"
	case KindDeletePrecondition:
		return "delete precondition conflict"
	case KindOtherConflict:
		return "other conflict"
	case KindGone:
		return "gone"
	default:
		return "none"
	}
}

// Classify is issue 4's definitions applied to one request.
func Classify(r Request) Kind {
	switch {
	case r.Code == 410:
		return KindGone
	case r.Code != 409:
		return KindNone
	case slices.Contains(r.Causes, fieldManagerConflict):
		return KindFieldConflict
	case r.Reason == "Conflict" && strings.Contains(r.Message, optimisticLockMessage):
		return KindVersionConflict
	case r.Reason == "AlreadyExists":
		return KindAlreadyExists
	case r.Reason == "Conflict" && r.Verb == "delete" && isPreconditionMessage(r.Message):
		return KindDeletePrecondition
	default:
		return KindOtherConflict
	}
}

func isPreconditionMessage(m string) bool {
	return (strings.Contains(m, "the UID in the precondition") || strings.Contains(m, "the ResourceVersion in the precondition")) &&
		strings.Contains(m, "does not match")
}

// IsWriteAttempt: create, update, patch, delete or deletecollection, except
// on the review APIs that store nothing.
func IsWriteAttempt(r Request) bool {
	switch r.APIGroup {
	case "authentication.k8s.io", "authorization.k8s.io":
		return false
	}
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// IsStamplessUpdate: an update answered 2xx whose body carried no stamp.
func IsStamplessUpdate(r Request) bool {
	return r.Verb == "update" && r.Succeeded() && r.Stamp == ""
}

type objectKey struct{ group, resource, namespace, name string }

func keyOf(r Request) objectKey { return objectKey{r.APIGroup, r.Resource, r.Namespace, r.Name} }

// LoopBounds names the requests that open and close one retry loop, so that
// a test can look their times up in the audit log (the client's clock and
// the apiserver's stageTimestamp differ by the request's latency).
type LoopBounds struct {
	FirstAuditID string `json:"first_audit_id"`
	LastAuditID  string `json:"last_audit_id"`
}

// Truth computes the report that `auditsink report --format json` must
// print for these requests, with exactly the definitions of issue 4. Only
// requests whose Start lies in [since, until) count, dry runs never do.
// Request times are the client's Start; requests are taken in Start order.
// The second result holds the Audit-Ids of each retry loop's first and last
// conflict, index for index with the report's RetryLoops.
//
// Lists are never nil (they encode as []) and are sorted so:
//   - conflicts_by_user: every writer with a write attempt; version_conflicts
//     desc, write_attempts desc, user asc.
//   - conflicts_by_resource: every (api_group, resource) with a write
//     attempt; version_conflicts desc, write_attempts desc, api_group asc,
//     resource asc.
//   - hot_objects: every object with a write attempt; version_conflicts desc,
//     distinct_writers desc, write_attempts desc, then api_group, resource,
//     namespace, name asc. Not truncated: compare with a --top at least as
//     long as the list.
//   - retry_loops: conflicts desc, then user, api_group, resource,
//     namespace, name asc, then first asc.
//   - stampless_updates: count desc, then user, api_group, resource,
//     namespace, name asc.
//   - lease_holder_changes: only leases with at least one change; changes
//     desc, then namespace, name asc. holders are the distinct non-empty
//     holders in the order they took the lease, the first one included.
//   - policy_decisions: empty (no stampguard webhook in the workload).
//
// The report's --namespace, --resource and --user filters select whole
// per-object sequences, so the truth for a filtered report is Truth of the
// requests that pass the same filter.
//
// A retry loop is broken by a successful write (not a read) by its writer
// on its object, or by a gap longer than LoopOptions.Gap; other failures
// (404, already exists, ...) neither extend nor break it.
func Truth(reqs []Request, since, until time.Time, lo LoopOptions) (report.Report, []LoopBounds) {
	lo.setDefaults()
	in := make([]Request, 0, len(reqs))
	for _, r := range reqs {
		if !r.DryRun && !r.Start.Before(since) && r.Start.Before(until) {
			in = append(in, r)
		}
	}
	slices.SortStableFunc(in, func(a, b Request) int { return a.Start.Compare(b.Start) })

	rep := report.Report{
		Window:              report.Window{Since: since.UTC().Format(TimeFormat), Until: until.UTC().Format(TimeFormat)},
		ConflictsByUser:     []report.UserConflicts{},
		ConflictsByResource: []report.ResourceConflicts{},
		HotObjects:          []report.HotObject{},
		RetryLoops:          []report.RetryLoop{},
		StamplessUpdates:    []report.StamplessUpdates{},
		LeaseHolderChanges:  []report.LeaseChanges{},
		PolicyDecisions:     []report.PolicyDecisions{},
		// The workloads log writes at Request level: no field history.
		LostUpdates:    []report.LostUpdate{},
		FieldFights:    []report.FieldFight{},
		ConflictCauses: []report.ConflictCause{},
		NoopWrites:     []report.NoopWrites{},
		FieldWriters:   []report.FieldWriter{},
	}
	t := &rep.Totals
	users := map[string]*report.UserConflicts{}
	resources := map[[2]string]*report.ResourceConflicts{}
	objects := map[objectKey]*report.HotObject{}
	writers := map[objectKey]map[string]bool{}
	stampless := map[[5]string]*report.StamplessUpdates{}
	for _, r := range in {
		t.Requests++
		kind := Classify(r)
		switch kind {
		case KindVersionConflict:
			t.VersionConflicts++
		case KindFieldConflict:
			t.FieldConflicts++
		case KindAlreadyExists:
			t.AlreadyExists++
		case KindDeletePrecondition:
			t.DeletePreconditionConflicts++
		case KindOtherConflict:
			t.OtherConflicts++
		case KindGone:
			t.Gone++
		}
		if IsStamplessUpdate(r) {
			t.StamplessUpdates++
			k := [5]string{r.Writer, r.APIGroup, r.Resource, r.Namespace, r.Name}
			if stampless[k] == nil {
				stampless[k] = &report.StamplessUpdates{User: r.Writer, APIGroup: r.APIGroup, Resource: r.Resource, Namespace: r.Namespace, Name: r.Name}
			}
			stampless[k].Count++
		}
		if !IsWriteAttempt(r) {
			continue
		}
		vc := uint64(0)
		if kind == KindVersionConflict {
			vc = 1
		}
		t.WriteAttempts++
		u := users[r.Writer]
		if u == nil {
			u = &report.UserConflicts{User: r.Writer}
			users[r.Writer] = u
		}
		u.WriteAttempts++
		u.VersionConflicts += vc
		rk := [2]string{r.APIGroup, r.Resource}
		rs := resources[rk]
		if rs == nil {
			rs = &report.ResourceConflicts{APIGroup: r.APIGroup, Resource: r.Resource}
			resources[rk] = rs
		}
		rs.WriteAttempts++
		rs.VersionConflicts += vc
		ok := keyOf(r)
		o := objects[ok]
		if o == nil {
			o = &report.HotObject{APIGroup: r.APIGroup, Resource: r.Resource, Namespace: r.Namespace, Name: r.Name}
			objects[ok] = o
			writers[ok] = map[string]bool{}
		}
		o.WriteAttempts++
		o.VersionConflicts += vc
		writers[ok][r.Writer] = true
		o.DistinctWriters = uint64(len(writers[ok]))
	}
	if t.WriteAttempts > 0 {
		t.ConflictRate = float64(t.VersionConflicts) / float64(t.WriteAttempts)
	}

	for _, u := range users {
		rep.ConflictsByUser = append(rep.ConflictsByUser, *u)
	}
	slices.SortFunc(rep.ConflictsByUser, func(a, b report.UserConflicts) int {
		return cmp.Or(cmp.Compare(b.VersionConflicts, a.VersionConflicts), cmp.Compare(b.WriteAttempts, a.WriteAttempts), cmp.Compare(a.User, b.User))
	})
	for _, r := range resources {
		rep.ConflictsByResource = append(rep.ConflictsByResource, *r)
	}
	slices.SortFunc(rep.ConflictsByResource, func(a, b report.ResourceConflicts) int {
		return cmp.Or(cmp.Compare(b.VersionConflicts, a.VersionConflicts), cmp.Compare(b.WriteAttempts, a.WriteAttempts),
			cmp.Compare(a.APIGroup, b.APIGroup), cmp.Compare(a.Resource, b.Resource))
	})
	for _, o := range objects {
		rep.HotObjects = append(rep.HotObjects, *o)
	}
	slices.SortFunc(rep.HotObjects, func(a, b report.HotObject) int {
		return cmp.Or(cmp.Compare(b.VersionConflicts, a.VersionConflicts), cmp.Compare(b.DistinctWriters, a.DistinctWriters),
			cmp.Compare(b.WriteAttempts, a.WriteAttempts), cmp.Compare(a.APIGroup, b.APIGroup), cmp.Compare(a.Resource, b.Resource),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, s := range stampless {
		rep.StamplessUpdates = append(rep.StamplessUpdates, *s)
	}
	slices.SortFunc(rep.StamplessUpdates, func(a, b report.StamplessUpdates) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.User, b.User), cmp.Compare(a.APIGroup, b.APIGroup),
			cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	var bounds []LoopBounds
	rep.RetryLoops, bounds = retryLoops(in, lo)
	rep.LeaseHolderChanges = leaseHolderChanges(in)
	return rep, bounds
}

type loop struct {
	report.RetryLoop
	first, last Request
}

// retryLoops finds the maximal runs of version conflicts per writer and object.
func retryLoops(in []Request, lo LoopOptions) ([]report.RetryLoop, []LoopBounds) {
	type wo struct {
		writer string
		obj    objectKey
	}
	open := map[wo]*loop{}
	var loops []*loop
	closeRun := func(k wo, resolved bool) {
		if l := open[k]; l != nil {
			l.Resolved = resolved
			if int(l.Conflicts) >= lo.Threshold {
				loops = append(loops, l)
			}
			delete(open, k)
		}
	}
	for _, r := range in {
		if !IsWriteAttempt(r) {
			continue
		}
		k := wo{r.Writer, keyOf(r)}
		switch {
		case Classify(r) == KindVersionConflict:
			if l := open[k]; l != nil && r.Start.Sub(l.last.Start) > lo.Gap {
				// A pause breaks the run; a success later still resolves it.
				closeRun(k, false)
			}
			l := open[k]
			if l == nil {
				l = &loop{RetryLoop: report.RetryLoop{User: r.Writer, APIGroup: r.APIGroup, Resource: r.Resource, Namespace: r.Namespace, Name: r.Name}, first: r}
				open[k] = l
			}
			l.Conflicts++
			l.last = r
		case r.Succeeded():
			closeRun(k, true)
			for _, l := range loops {
				if l.User == r.Writer && keyOf(l.first) == k.obj {
					l.Resolved = true
				}
			}
		}
	}
	for k := range open {
		closeRun(k, false)
	}
	slices.SortFunc(loops, func(a, b *loop) int {
		return cmp.Or(cmp.Compare(b.Conflicts, a.Conflicts), cmp.Compare(a.User, b.User), cmp.Compare(a.APIGroup, b.APIGroup),
			cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			a.first.Start.Compare(b.first.Start))
	})
	out := make([]report.RetryLoop, 0, len(loops))
	bounds := make([]LoopBounds, 0, len(loops))
	for _, l := range loops {
		l.First = l.first.Start.UTC().Format(TimeFormat)
		l.Last = l.last.Start.UTC().Format(TimeFormat)
		out = append(out, l.RetryLoop)
		bounds = append(bounds, LoopBounds{FirstAuditID: l.first.AuditID, LastAuditID: l.last.AuditID})
	}
	return out, bounds
}

// leaseHolderChanges follows spec.holderIdentity through successful writes
// to leases.
func leaseHolderChanges(in []Request) []report.LeaseChanges {
	type nn struct{ namespace, name string }
	last := map[nn]string{}
	seen := map[nn]*report.LeaseChanges{}
	for _, r := range in {
		if r.Resource != "leases" || r.APIGroup != "coordination.k8s.io" || !IsWriteAttempt(r) || !r.Succeeded() ||
			r.Holder == nil || *r.Holder == "" {
			continue
		}
		k := nn{r.Namespace, r.Name}
		h := *r.Holder
		prev, ok := last[k]
		if ok && prev == h {
			continue
		}
		last[k] = h
		lc := seen[k]
		if lc == nil {
			lc = &report.LeaseChanges{Namespace: r.Namespace, Name: r.Name}
			seen[k] = lc
		}
		lc.Holders = append(lc.Holders, h)
		if ok {
			lc.Changes++
		}
	}
	out := []report.LeaseChanges{}
	for _, lc := range seen {
		if lc.Changes > 0 {
			out = append(out, *lc)
		}
	}
	slices.SortFunc(out, func(a, b report.LeaseChanges) int {
		return cmp.Or(cmp.Compare(b.Changes, a.Changes), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}
