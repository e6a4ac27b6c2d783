package workload

import (
	"reflect"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
)

func TestRefusals(t *testing.T) {
	deny := func(policy, kind string) report.PolicyDecisions {
		return report.PolicyDecisions{Policy: policy, Kind: kind, Action: "deny", Count: 1}
	}
	for _, c := range []struct {
		name string
		req  Request
		want []report.PolicyDecisions
	}{
		{
			name: "a stampless update refused by two policies names both",
			req:  Request{Code: 422, Reason: "Invalid", Message: `admission webhook "stamp.stampguard.dev" denied the request: ConcurrencyPolicy "a", "b": metadata.resourceVersion: Invalid value: "": must be specified for an update`},
			want: []report.PolicyDecisions{deny("a", "stamp-missing"), deny("b", "stamp-missing")},
		},
		{
			name: "a field owner and an immutable field in one refusal",
			req: Request{Code: 422, Reason: "Invalid", Message: `admission webhook "fields.stampguard.dev" denied the request: ` +
				`ConcurrencyPolicy "shop": spec.replicas is owned by kube-system/hpa; deploy-tool may not change it (5 -> 3); ` +
				`ConcurrencyPolicy "shop": metadata.labels["team"] is immutable; deploy-tool may not change it ("a" -> "b")`},
			want: []report.PolicyDecisions{deny("shop", "field-owner"), deny("shop", "immutable-field")},
		},
		{
			name: "a delete without a precondition",
			req:  Request{Code: 422, Message: `admission webhook "fields.stampguard.dev" denied the request: ConcurrencyPolicy "p": deletes of deployments must carry a uid precondition; alice sent none`},
			want: []report.PolicyDecisions{deny("p", "delete-precondition")},
		},
		{
			name: "a 422 from elsewhere is not stampguard's",
			req:  Request{Code: 422, Message: `Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1`},
		},
		{
			name: "a 403 from RBAC is not stampguard's",
			req:  Request{Code: 403, Message: `configmaps "x" is forbidden: User "bob" cannot update resource "configmaps"`},
		},
		{
			name: "an allowed write carries no refusal",
			req:  Request{Code: 200},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Refusals(c.req); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Refusals = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestPolicyDecisionsCountsInTheWindowAndSorts(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	refused := Request{Code: 422, Message: `admission webhook "stamp.stampguard.dev" denied the request: ConcurrencyPolicy "shop": metadata.resourceVersion: Invalid value: "": must be specified for an update`}
	at := func(r Request, d time.Duration, dry bool) Request { r.Start, r.DryRun = t0.Add(d), dry; return r }
	audited := func(r Request) []report.PolicyDecisions {
		if r.Code == 200 {
			return []report.PolicyDecisions{{Policy: "legacy", Kind: "stamp-missing", Action: "audit", Count: 1}}
		}
		return nil
	}
	reqs := []Request{
		at(refused, 0, false), at(refused, time.Second, false), at(refused, 2*time.Second, true), // the dry run does not count
		at(refused, -time.Second, false), at(refused, time.Hour, false), // outside the window
		at(Request{Code: 200}, time.Second, false),
	}
	got := PolicyDecisions(reqs, t0, t0.Add(time.Minute), audited)
	want := []report.PolicyDecisions{
		{Policy: "shop", Kind: "stamp-missing", Action: "deny", Count: 2},
		{Policy: "legacy", Kind: "stamp-missing", Action: "audit", Count: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PolicyDecisions = %+v, want %+v", got, want)
	}
	if got := PolicyDecisions(nil, t0, t0, nil); got == nil || len(got) != 0 {
		t.Fatalf("no requests: %#v, want an empty list", got)
	}
}
