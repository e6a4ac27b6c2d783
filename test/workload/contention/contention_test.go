package contention

import (
	"testing"

	wl "github.com/stampguard/stampguard/test/workload"
)

func TestAuditedIsTheLegacyPolicysStamplessUpdates(t *testing.T) {
	stampless := wl.Request{Verb: "update", Resource: "configmaps", Namespace: Legacy, Name: Flags, Code: 200}
	for _, c := range []struct {
		name string
		req  wl.Request
		want int
	}{
		{"a stampless update of a legacy configmap that went through", stampless, 1},
		{"a stamped one", func() wl.Request { r := stampless; r.Stamp = "42"; return r }(), 0},
		{"one in the guarded namespace (refused there)", func() wl.Request { r := stampless; r.Namespace = Shop; r.Code = 422; return r }(), 0},
		{"a create", func() wl.Request { r := stampless; r.Verb = "create"; r.Code = 201; return r }(), 0},
		{"a stampless deployment update", func() wl.Request { r := stampless; r.APIGroup, r.Resource = "apps", "deployments"; return r }(), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Audited(c.req)
			if len(got) != c.want {
				t.Fatalf("Audited = %+v, want %d decisions", got, c.want)
			}
			if c.want == 1 && (got[0].Policy != AuditPolicyName || got[0].Kind != "stamp-missing" || got[0].Action != "audit") {
				t.Fatalf("Audited = %+v", got)
			}
		})
	}
}

func TestCount(t *testing.T) {
	reqs := []wl.Request{
		{Verb: "get", Resource: "configmaps", Code: 200},
		{Verb: "update", Resource: "configmaps", Code: 200},
		{Verb: "update", Resource: "configmaps", Code: 409, Reason: "Conflict",
			Message: "Operation cannot be fulfilled on configmaps \"catalog\": the object has been modified; please apply your changes to the latest version and try again"},
		{Verb: "update", Resource: "configmaps", Code: 422,
			Message: `admission webhook "stamp.stampguard.dev" denied the request: ConcurrencyPolicy "shop-configmaps": metadata.resourceVersion: Invalid value: "": must be specified for an update`},
	}
	if w, c, r := Count(reqs); w != 3 || c != 1 || r != 1 {
		t.Fatalf("Count = %d writes, %d conflicts, %d refusals; want 3, 1, 1", w, c, r)
	}
}
