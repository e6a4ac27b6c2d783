package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/kubetest"
	wl "github.com/stampguard/stampguard/test/workload"
)

// The policies whose decisions annotatedWorkload writes into the log, in
// the stampguard webhooks' annotation format (policy/admission): an
// Audit-mode requireResourceVersion policy, which records every stampless
// update it lets through, and a Warn-mode field owner, which records every
// successful patch.
const (
	auditStamplessPolicy = "wl-audit-stampless"
	warnOwnerPolicy      = "wl-warn-owners"
)

// workloadDecisions are the stampguard decisions of request r under the
// two policies above, as the report counts them.
func workloadDecisions(r wl.Request) []report.PolicyDecisions {
	var ds []report.PolicyDecisions
	if wl.IsStamplessUpdate(r) {
		ds = append(ds, report.PolicyDecisions{Policy: auditStamplessPolicy, Kind: "stamp-missing", Action: "audit", Count: 1})
	}
	if r.Verb == "patch" && r.Succeeded() {
		ds = append(ds, report.PolicyDecisions{Policy: warnOwnerPolicy, Kind: "field-owner", Action: "warn", Count: 1})
	}
	return ds
}

// decisionAnnotations are the audit annotations the apiserver writes for
// the webhooks' answer carrying ds: the key is the webhook's name and the
// rule kind, the value the JSON array policy/admission writes.
func decisionAnnotations(r wl.Request, ds []report.PolicyDecisions) map[string]string {
	out := map[string]string{}
	for _, d := range ds {
		webhook, rule, path := "stamp.stampguard.dev", "requireResourceVersion", "metadata.resourceVersion"
		if d.Kind != "stamp-missing" {
			webhook, rule, path = "fields.stampguard.dev", "fieldOwners[0]", "spec.replicas"
		}
		entry, _ := json.Marshal(map[string]string{"policy": d.Policy, "rule": rule,
			"action": strings.ToUpper(d.Action[:1]) + d.Action[1:], "path": path, "writer": r.Writer})
		out[webhook+"/"+d.Kind] = "[" + string(entry) + "]"
	}
	return out
}

// groundTruth is a workload's audit log and what its report must say.
type groundTruth struct {
	res   *wl.Result
	lines []string // the audit log, decisions annotated
	want  report.Report
	json  []byte // want, indented as the tests compare it
}

// truthShift moves the workload's events back in time: their hours are
// then closed, and `auditsink migrate` or `ingest` builds their hour
// caches, which a report over whole hours reads when the hour is clean.
const truthShift = 3 * time.Hour

// annotatedWorkload runs the scripted workload on a real apiserver and
// returns its audit log with the stampguard decisions of workloadDecisions
// added to the ResponseComplete events and every timestamp moved back by
// truthShift, and the ground truth: the report computed from what the
// clients saw (moved back the same), its policy_decisions from the same
// decisions. Every section of the report is nonzero in it (checked).
// gt.res's Since and Until are moved back; its requests are as sent.
func annotatedWorkload(t *testing.T) *groundTruth {
	t.Helper()
	env := kubetest.Start(t, wl.KubetestOptions())
	ctx := t.Context()
	res, err := wl.Run(ctx, env)
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	events, err := res.WaitAudited(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := res.TruthAt(events)
	if err != nil {
		t.Fatal(err)
	}
	want.PolicyDecisions = wl.PolicyDecisions(res.Requests, res.Since, res.Until, workloadDecisions)

	annotations := map[string]map[string]string{}
	for _, r := range res.Requests {
		if ds := workloadDecisions(r); len(ds) > 0 {
			annotations[r.AuditID] = decisionAnnotations(r, ds)
		}
	}
	var lines []string
	annotated := 0
	for _, l := range completeLines(t, env.AuditLogPath) {
		var ev struct {
			AuditID     string            `json:"auditID"`
			Stage       string            `json:"stage"`
			Annotations map[string]string `json:"annotations"`
			Received    time.Time         `json:"requestReceivedTimestamp"`
			At          time.Time         `json:"stageTimestamp"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &raw); err != nil {
			t.Fatal(err)
		}
		raw["requestReceivedTimestamp"], _ = json.Marshal(ev.Received.Add(-truthShift).UTC().Format(wl.TimeFormat))
		raw["stageTimestamp"], _ = json.Marshal(ev.At.Add(-truthShift).UTC().Format(wl.TimeFormat))
		if add := annotations[ev.AuditID]; ev.Stage == audit.StageResponseComplete && add != nil {
			if ev.Annotations == nil {
				ev.Annotations = map[string]string{}
			}
			for k, v := range add {
				ev.Annotations[k] = v
			}
			raw["annotations"], _ = json.Marshal(ev.Annotations)
			annotated++
		}
		b, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	if annotated != len(annotations) {
		t.Fatalf("annotated %d events for the decisions of %d requests", annotated, len(annotations))
	}
	// The times move back with the events.
	shift := func(ts string) string {
		tm, err := time.Parse(wl.TimeFormat, ts)
		if err != nil {
			t.Fatal(err)
		}
		return tm.Add(-truthShift).UTC().Format(wl.TimeFormat)
	}
	want.Window = report.Window{Since: shift(want.Window.Since), Until: shift(want.Window.Until)}
	for i := range want.RetryLoops {
		want.RetryLoops[i].First, want.RetryLoops[i].Last = shift(want.RetryLoops[i].First), shift(want.RetryLoops[i].Last)
	}
	moved := *res
	moved.Since, moved.Until = res.Since.Add(-truthShift), res.Until.Add(-truthShift)
	res = &moved
	requireEverySection(t, want)
	js, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return &groundTruth{res: res, lines: lines, want: want, json: js}
}

// requireEverySection fails unless every section and every total of r is
// nonzero: a comparison with r then proves each of them.
func requireEverySection(t *testing.T, r report.Report) {
	t.Helper()
	tot := r.Totals
	for _, c := range []struct {
		what string
		n    uint64
	}{
		{"requests", tot.Requests}, {"write attempts", tot.WriteAttempts}, {"version conflicts", tot.VersionConflicts},
		{"field conflicts", tot.FieldConflicts}, {"already exists", tot.AlreadyExists},
		{"delete precondition conflicts", tot.DeletePreconditionConflicts}, {"stampless updates", tot.StamplessUpdates},
		{"other conflicts", tot.OtherConflicts}, {"gone", tot.Gone},
		{"conflicts_by_user", uint64(len(r.ConflictsByUser))}, {"conflicts_by_resource", uint64(len(r.ConflictsByResource))},
		{"hot_objects", uint64(len(r.HotObjects))}, {"retry_loops", uint64(len(r.RetryLoops))},
		{"stampless_updates", uint64(len(r.StamplessUpdates))}, {"lease_holder_changes", uint64(len(r.LeaseHolderChanges))},
		{"policy_decisions", uint64(len(r.PolicyDecisions))},
	} {
		if c.n == 0 {
			t.Errorf("the ground truth has no %s: the comparison would not prove them", c.what)
		}
	}
	kinds := map[string]bool{}
	for _, d := range r.PolicyDecisions {
		kinds[d.Kind+"/"+d.Action] = true
	}
	if len(kinds) < 2 {
		t.Errorf("the ground truth's policy decisions are of %d kinds, want 2 or more: %+v", len(kinds), r.PolicyDecisions)
	}
}

// sharedGroundTruth is annotatedWorkload, run by the first test that asks
// and shared by the others.
func sharedGroundTruth(t *testing.T) *groundTruth {
	t.Helper()
	sharedTruth.Lock()
	defer sharedTruth.Unlock()
	if sharedTruth.gt == nil {
		sharedTruth.gt = annotatedWorkload(t)
	}
	return sharedTruth.gt
}
