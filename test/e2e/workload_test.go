package e2e

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/test/kubetest"
	wl "github.com/stampguard/stampguard/test/workload"
)

// TestWorkload runs the conflict workload against a real apiserver and
// checks its ground truth against the audit log the apiserver wrote: the
// same requests, each once, with the same codes, and nothing else.
func TestWorkload(t *testing.T) {
	env := kubetest.Start(t, wl.KubetestOptions())
	// The audit policy matches the authenticated user, before impersonation:
	// this admin request in a writer's name must not reach the log (checked
	// below with everything else the workload did not record).
	alice := env.ClientAs(t, "alice")
	if err := alice.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "not-audited"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := wl.Run(t.Context(), env)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("workload: %d requests in %s", len(res.Requests), time.Since(start).Round(time.Millisecond))
	events, err := res.WaitAudited(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("every recorded request is audited once at ResponseComplete with its code", func(t *testing.T) {
		complete := map[string][]auditv1.Event{}
		for _, ev := range events {
			if ev.Stage == auditv1.StageResponseComplete {
				complete[string(ev.AuditID)] = append(complete[string(ev.AuditID)], ev)
			}
		}
		for _, r := range res.Requests {
			evs := complete[r.AuditID]
			if len(evs) != 1 {
				t.Errorf("%s %s %s/%s (%s): %d ResponseComplete events, want 1", r.Verb, r.Resource, r.Namespace, r.Name, r.AuditID, len(evs))
				continue
			}
			ev := evs[0]
			if ev.ResponseStatus == nil || int(ev.ResponseStatus.Code) != r.Code {
				t.Errorf("%s: audit code %v, client saw %d", r.AuditID, ev.ResponseStatus, r.Code)
			}
			if ev.ImpersonatedUser == nil || ev.ImpersonatedUser.Username != r.Writer {
				t.Errorf("%s: audit impersonatedUser %v, client impersonated %q", r.AuditID, ev.ImpersonatedUser, r.Writer)
			}
			if ev.User.Username != wl.DriverUser {
				t.Errorf("%s: audit user %q, want the driver %q", r.AuditID, ev.User.Username, wl.DriverUser)
			}
			if ev.Verb != r.Verb {
				t.Errorf("%s: audit verb %q, client verb %q", r.AuditID, ev.Verb, r.Verb)
			}
			if ref := ev.ObjectRef; ref == nil || ref.APIGroup != r.APIGroup || ref.Resource != r.Resource || ref.Namespace != r.Namespace || ref.Name != r.Name || ref.Subresource != r.Subresource {
				t.Errorf("%s: audit objectRef %+v, client object %s/%s %s/%s", r.AuditID, ref, r.APIGroup, r.Resource, r.Namespace, r.Name)
			}
			if (r.Verb == "create" || r.Verb == "update") && ev.ObjectRef != nil && ev.ObjectRef.ResourceVersion != r.Stamp {
				t.Errorf("%s: audit objectRef.resourceVersion %q, client sent stamp %q", r.AuditID, ev.ObjectRef.ResourceVersion, r.Stamp)
			}
			if r.Code >= 400 {
				if ev.ResponseStatus == nil || ev.ResponseStatus.Reason != metav1.StatusReason(r.Reason) || ev.ResponseStatus.Message != r.Message {
					t.Errorf("%s: audit status %+v, client saw %s %q", r.AuditID, ev.ResponseStatus, r.Reason, r.Message)
				}
				var causes []string
				if ev.ResponseStatus != nil && ev.ResponseStatus.Details != nil {
					for _, c := range ev.ResponseStatus.Details.Causes {
						causes = append(causes, string(c.Type))
					}
				}
				if !slices.Equal(causes, r.Causes) {
					t.Errorf("%s: audit causes %v, client saw %v", r.AuditID, causes, r.Causes)
				}
			}
			if r.Holder != nil {
				var body struct {
					Spec struct {
						HolderIdentity *string `json:"holderIdentity"`
					} `json:"spec"`
				}
				if ev.RequestObject == nil || json.Unmarshal(ev.RequestObject.Raw, &body) != nil || body.Spec.HolderIdentity == nil || *body.Spec.HolderIdentity != *r.Holder {
					t.Errorf("%s: audit requestObject lacks holder %q", r.AuditID, *r.Holder)
				}
			}
			if ev.StageTimestamp.Time.Before(res.Since) || !ev.StageTimestamp.Time.Before(res.Until) {
				t.Errorf("%s: stageTimestamp %s outside [%s, %s)", r.AuditID, ev.StageTimestamp.Time, res.Since, res.Until)
			}
		}
	})

	t.Run("the audit log orders the requests as the client sent them", func(t *testing.T) {
		// The script is sequential, so ordering events by stageTimestamp (as
		// the report does for retry loops and lease holders) must give the
		// client's order.
		at := map[string]time.Time{}
		for _, ev := range events {
			if ev.Stage == auditv1.StageResponseComplete {
				at[string(ev.AuditID)] = ev.StageTimestamp.Time
			}
		}
		// The apiserver writes ResponseComplete before it flushes the
		// response, so the client's clock brackets the audit time.
		for _, r := range res.Requests {
			if ts := at[r.AuditID]; ts.Before(r.Start) || ts.After(r.End) {
				t.Errorf("%s: ResponseComplete at %s, outside the client's [%s, %s]", r.AuditID,
					ts.Format(wl.TimeFormat), r.Start.Format(wl.TimeFormat), r.End.Format(wl.TimeFormat))
			}
		}
		for i := 1; i < len(res.Requests); i++ {
			p, r := res.Requests[i-1], res.Requests[i]
			if !at[p.AuditID].Before(at[r.AuditID]) {
				t.Errorf("request %d (%s %s/%s by %s) completed at %s, not after request %d at %s",
					i, r.Verb, r.Namespace, r.Name, r.Writer, at[r.AuditID].Format(wl.TimeFormat), i-1, at[p.AuditID].Format(wl.TimeFormat))
			}
		}
	})

	t.Run("the audit log holds only the workload's requests", func(t *testing.T) {
		recorded := map[string]bool{}
		for _, r := range res.Requests {
			recorded[r.AuditID] = true
		}
		for _, ev := range events {
			if !recorded[string(ev.AuditID)] {
				t.Errorf("audit event the workload did not send: %s %s %s %s by %s", ev.Stage, ev.Verb, ev.RequestURI, ev.AuditID, ev.User.Username)
			}
		}
		// The policy logs every stage: each request has RequestReceived and
		// ResponseComplete, and nothing else (the script runs no watches).
		stages := map[string][]auditv1.Stage{}
		for _, ev := range events {
			stages[string(ev.AuditID)] = append(stages[string(ev.AuditID)], ev.Stage)
		}
		for id, st := range stages {
			if !slices.Equal(st, []auditv1.Stage{auditv1.StageRequestReceived, auditv1.StageResponseComplete}) {
				t.Errorf("%s: stages %v, want RequestReceived then ResponseComplete", id, st)
			}
		}
		t.Logf("audit log: %d events for %d requests", len(events), len(stages))
		// The admin client created the namespaces and polled for compaction:
		// the policy matches the authenticated user, so none of it shows.
		if n := len(res.Requests); n == 0 {
			t.Fatal("the workload recorded no requests")
		}
	})

	t.Run("410s are Expired with the apiserver's messages", func(t *testing.T) {
		want := map[string]bool{
			// A LIST with resourceVersionMatch=Exact at a compacted resourceVersion.
			"The resourceVersion for the provided list is too old.": true,
			// A LIST whose continue token names a compacted resourceVersion.
			"The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.": true,
		}
		seen := map[string]bool{}
		for _, r := range res.Requests {
			if r.Code != 410 {
				continue
			}
			if r.Reason != "Expired" || !want[r.Message] {
				t.Errorf("%s %s: 410 %s %q", r.Verb, r.Resource, r.Reason, r.Message)
			}
			seen[r.Message] = true
		}
		if len(seen) != len(want) {
			t.Errorf("saw 410 messages %v, want both of %v", seen, want)
		}
	})

	t.Run("the ground truth has every kind of finding", func(t *testing.T) {
		tr := res.Truth
		b, _ := json.MarshalIndent(tr, "", "  ")
		t.Logf("ground truth:\n%s", b)
		tot := tr.Totals
		// The script is deterministic: these are its planned findings.
		want := report.Totals{
			Requests: 111, WriteAttempts: 80,
			// contention 3 rounds x (bob 1 + carol 2), stale-controller 7,
			// flaky-operator 5, patient-operator 4, autoscaler 1, leader-a 1.
			VersionConflicts: 27, FieldConflicts: 2, AlreadyExists: 2, DeletePreconditionConflicts: 1,
			// ci-bot 3, deployer 1, autoscaler 1 (scale subresource).
			StamplessUpdates: 5, Gone: 2, OtherConflicts: 1, ConflictRate: 27.0 / 80,
		}
		if tot != want {
			t.Errorf("totals:\n got %+v\nwant %+v", tot, want)
		}
		for _, r := range res.Requests {
			if r.Code >= 400 {
				t.Logf("%s %s %s/%s by %s: %d %s %q %v", r.Verb, r.Resource, r.Namespace, r.Name, r.Writer, r.Code, r.Reason, r.Message, r.Causes)
			}
		}
		for _, c := range []struct {
			what string
			got  uint64
			min  uint64
		}{
			{"version conflicts", tot.VersionConflicts, 1},
			{"field conflicts", tot.FieldConflicts, 1},
			{"gone", tot.Gone, 2},
			{"stampless updates", tot.StamplessUpdates, 1},
			{"already exists", tot.AlreadyExists, 1},
			{"delete precondition conflicts", tot.DeletePreconditionConflicts, 1},
			{"lease holder changes", uint64(len(tr.LeaseHolderChanges)), 1},
		} {
			if c.got < c.min {
				t.Errorf("%s: %d, want at least %d", c.what, c.got, c.min)
			}
		}
		if tot.OtherConflicts != 1 {
			t.Errorf("other conflicts: %d, want the scheduler's second binding", tot.OtherConflicts)
		}
		var resolved, unresolved int
		for _, l := range tr.RetryLoops {
			if l.Resolved {
				resolved++
			} else {
				unresolved++
			}
		}
		if resolved < 1 || unresolved < 1 {
			t.Errorf("retry loops: %d resolved, %d unresolved; want at least one of each: %+v", resolved, unresolved, tr.RetryLoops)
		}
		if len(res.Loops) != len(tr.RetryLoops) {
			t.Errorf("%d loop bounds for %d retry loops", len(res.Loops), len(tr.RetryLoops))
		}
		if _, err := res.TruthAt(events); err != nil {
			t.Errorf("truth at audit times: %v", err)
		}
	})
}
