package policy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

func mustCompile(t *testing.T, name string, spec v1alpha1.ConcurrencyPolicySpec) *Policy {
	t.Helper()
	p, err := Compile(&v1alpha1.ConcurrencyPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
	if err != nil {
		t.Fatalf("compile %s: %v", name, err)
	}
	return p
}

func deployments(ns ...string) v1alpha1.Match {
	return v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}, Namespaces: ns}
}

func deploy(replicas, team, rv string) []byte {
	meta := `"name":"web","namespace":"shop"`
	if rv != "" {
		meta += `,"resourceVersion":"` + rv + `"`
	}
	if team != "" {
		meta += `,"labels":{"team":"` + team + `"}`
	}
	return []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{` + meta + `},"spec":{"replicas":` + replicas + `}}`)
}

// scale is an autoscaling/v1 Scale of the web Deployment, which carries the
// Deployment's resourceVersion.
func scale(rv string) []byte {
	meta := `"name":"web","namespace":"shop"`
	if rv != "" {
		meta += `,"resourceVersion":"` + rv + `"`
	}
	return []byte(`{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{` + meta + `},"spec":{"replicas":3}}`)
}

type nsLabels map[string]labels.Set

func (n nsLabels) Labels(ns string) (labels.Set, bool) { s, ok := n[ns]; return s, ok }

func TestCheckFields(t *testing.T) {
	hpa := "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
	owners := mustCompile(t, "deployments", v1alpha1.ConcurrencyPolicySpec{
		Match: deployments("shop"),
		FieldOwners: []v1alpha1.FieldOwner{{Path: "spec.replicas", Writers: v1alpha1.Writers{
			ServiceAccounts: []string{"kube-system/horizontal-pod-autoscaler"},
		}}},
		ImmutableFields: []v1alpha1.ImmutableField{{Path: `metadata.labels["team"]`, Mode: v1alpha1.ImmutableOnceSet}},
	})
	warnOnly := mustCompile(t, "advisory", v1alpha1.ConcurrencyPolicySpec{
		Action: v1alpha1.ActionWarn, Match: deployments(),
		FieldOwners: []v1alpha1.FieldOwner{{Path: "spec.replicas", Writers: v1alpha1.Writers{Groups: []string{"ops"}}}},
	})
	deletes := mustCompile(t, "deletes", v1alpha1.ConcurrencyPolicySpec{
		Match: deployments(), RequireDeletePreconditions: v1alpha1.DeletePreconditionUID,
	})
	selected := mustCompile(t, "selected", v1alpha1.ConcurrencyPolicySpec{
		Match: v1alpha1.Match{
			Resources:         []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guard": "yes"}},
		},
		ImmutableFields: []v1alpha1.ImmutableField{{Path: "spec.replicas"}},
	})
	env := &Environment{
		ProtectedNamespaces: append(DefaultProtectedNamespaces, "stampguard"), BreakGlassGroup: "break-glass",
		Namespaces: nsLabels{"guarded": {"guard": "yes"}},
	}
	update := func(user string, groups []string, ns, sub string, old, cur []byte) *Request {
		return &Request{Operation: Update, Group: "apps", Resource: "deployments", SubResource: sub, Namespace: ns, Name: "web",
			User: UserInfo{Name: user, Groups: groups}, OldObject: old, Object: cur}
	}
	cases := []struct {
		name    string
		set     *Set
		req     *Request
		want    v1alpha1.Action
		message string
	}{
		{"the owner may change its field", NewSet(owners), update(hpa, nil, "shop", "", deploy("3", "a", "1"), deploy("5", "a", "1")), "", ""},
		{"another writer may not, and the message names owner, writer and values", NewSet(owners),
			update("alice", nil, "shop", "", deploy("3", "a", "1"), deploy("5", "a", "1")), v1alpha1.ActionDeny,
			`ConcurrencyPolicy "deployments": spec.replicas is owned by ` + hpa + `; alice may not change it (3 -> 5)`},
		{"another writer may change other fields", NewSet(owners), update("alice", nil, "shop", "", deploy("3", "", "1"), deploy("3", "a", "1")), "", ""},
		{"the scale subresource is covered by a spec.replicas rule", NewSet(owners),
			update("alice", nil, "shop", "scale", []byte(`{"spec":{"replicas":3}}`), []byte(`{"spec":{"replicas":4}}`)), v1alpha1.ActionDeny, "spec.replicas is owned"},
		{"other rules do not apply to the scale subresource", NewSet(owners),
			update("alice", nil, "shop", "scale", []byte(`{"metadata":{"labels":{"team":"a"}},"spec":{"replicas":3}}`), []byte(`{"spec":{"replicas":3}}`)), "", ""},
		{"a status update is not covered by the main resource", NewSet(owners), update("alice", nil, "shop", "status", deploy("3", "a", "1"), deploy("5", "b", "1")), "", ""},
		{"a OnceSet field may not change once set", NewSet(owners), update(hpa, nil, "shop", "", deploy("3", "a", "1"), deploy("3", "b", "1")), v1alpha1.ActionDeny, "immutable once set"},
		{"a policy limited to a namespace ignores others", NewSet(owners), update("alice", nil, "other", "", deploy("3", "a", "1"), deploy("5", "a", "1")), "", ""},
		{"protected namespaces are skipped unless named", NewSet(warnOnly), update("alice", nil, "kube-system", "", deploy("3", "", "1"), deploy("5", "", "1")), "", ""},
		{"the webhook's own namespace is skipped", NewSet(warnOnly), update("alice", nil, "stampguard", "", deploy("3", "", "1"), deploy("5", "", "1")), "", ""},
		{"break-glass members bypass every policy", NewSet(owners), update("alice", []string{"break-glass"}, "shop", "", deploy("3", "a", "1"), deploy("5", "a", "1")), "", ""},
		{"overlapping policies: the strictest action wins", NewSet(warnOnly, owners), update("alice", nil, "shop", "", deploy("3", "a", "1"), deploy("5", "a", "1")), v1alpha1.ActionDeny, ""},
		{"a Warn policy alone warns", NewSet(warnOnly), update("alice", nil, "dev", "", deploy("3", "", "1"), deploy("5", "", "1")), v1alpha1.ActionWarn, `ConcurrencyPolicy "advisory"`},
		{"a namespace selector matches labelled namespaces", NewSet(selected), update("alice", nil, "guarded", "", deploy("3", "", "1"), deploy("4", "", "1")), v1alpha1.ActionDeny, ""},
		{"a namespace selector skips unlabelled namespaces", NewSet(selected), update("alice", nil, "plain", "", deploy("3", "", "1"), deploy("4", "", "1")), "", ""},
		{"a delete without a uid precondition is refused", NewSet(deletes),
			&Request{Operation: Delete, Group: "apps", Resource: "deployments", Namespace: "shop", Name: "web", User: UserInfo{Name: "alice"}, Options: []byte(`{"kind":"DeleteOptions"}`)},
			v1alpha1.ActionDeny, "must carry a uid precondition"},
		{"a delete with a uid precondition passes", NewSet(deletes),
			&Request{Operation: Delete, Group: "apps", Resource: "deployments", Namespace: "shop", Name: "web", User: UserInfo{Name: "alice"}, Options: []byte(`{"preconditions":{"uid":"u-1"}}`)}, "", ""},
		{"the garbage collector is exempt", NewSet(deletes),
			&Request{Operation: Delete, Group: "apps", Resource: "deployments", Namespace: "shop", Name: "web", User: UserInfo{Name: "system:serviceaccount:kube-system:generic-garbage-collector"}}, "", ""},
		{"the items of a deletecollection are exempt", NewSet(deletes),
			&Request{Operation: Delete, Group: "apps", Resource: "deployments", Namespace: "shop", Name: "", User: UserInfo{Name: "alice"}}, "", ""},
		{"a create is not checked by field owners unless the rule says so", NewSet(owners),
			&Request{Operation: Create, Group: "apps", Resource: "deployments", Namespace: "shop", Name: "web", User: UserInfo{Name: "alice"}, Object: deploy("5", "a", "")}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.set.CheckFields(c.req, env)
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Action(); got != c.want {
				t.Fatalf("action %q, want %q (violations %+v)", got, c.want, d.Violations)
			}
			if c.message != "" && !strings.Contains(d.Violations[0].Message, c.message) {
				t.Fatalf("message %q lacks %q", d.Violations[0].Message, c.message)
			}
			again, _ := c.set.CheckFields(c.req, env)
			if len(again.Violations) != len(d.Violations) {
				t.Fatal("a second evaluation of the same request differs")
			}
		})
	}
}

func TestCheckStamp(t *testing.T) {
	p := mustCompile(t, "stamp", v1alpha1.ConcurrencyPolicySpec{Match: deployments(), RequireResourceVersion: true})
	audit := mustCompile(t, "stamp-audit", v1alpha1.ConcurrencyPolicySpec{Action: v1alpha1.ActionAudit, Match: deployments(), RequireResourceVersion: true})
	env := &Environment{}
	cases := []struct {
		name string
		set  *Set
		req  Request
		want int
	}{
		{"a stampless update is refused", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", Namespace: "shop", Object: deploy("1", "", "")}, 1},
		{"an empty stamp counts as none", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", Namespace: "shop", Object: []byte(`{"metadata":{"resourceVersion":""}}`)}, 1},
		{"a stamped update passes", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", Namespace: "shop", Object: deploy("1", "", "42")}, 0},
		{"a create needs no stamp", NewSet(p), Request{Operation: Create, Group: "apps", Resource: "deployments", Namespace: "shop", Object: deploy("1", "", "")}, 0},
		{"another kind is untouched", NewSet(p), Request{Operation: Update, Group: "", Resource: "configmaps", Namespace: "shop", Object: []byte(`{}`)}, 0},
		{"a stampless Scale PUT on a guarded workload is refused", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", SubResource: "scale", Namespace: "shop", Object: scale("")}, 1},
		{"a stamped Scale PUT passes", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", SubResource: "scale", Namespace: "shop", Object: scale("42")}, 0},
		{"other subresources of a guarded workload are not covered", NewSet(p), Request{Operation: Update, Group: "apps", Resource: "deployments", SubResource: "status", Namespace: "shop", Object: deploy("1", "", "")}, 0},
		{"every matching policy is named", NewSet(p, audit), Request{Operation: Update, Group: "apps", Resource: "deployments", Namespace: "shop", Object: deploy("1", "", "")}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.set.CheckStamp(&c.req, env)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Violations) != c.want {
				t.Fatalf("got %d violations, want %d: %+v", len(d.Violations), c.want, d.Violations)
			}
		})
	}
}

func TestStarNeverCoversEventsLeasesOrSubresources(t *testing.T) {
	p := mustCompile(t, "all", v1alpha1.ConcurrencyPolicySpec{
		Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "*", Resource: "*"}}}, RequireResourceVersion: true,
	})
	set, env := NewSet(p), &Environment{}
	for _, r := range []Request{
		{Operation: Update, Group: "", Resource: "events", Namespace: "a"},
		{Operation: Update, Group: "events.k8s.io", Resource: "events", Namespace: "a"},
		{Operation: Update, Group: "coordination.k8s.io", Resource: "leases", Namespace: "a"},
		{Operation: Update, Group: "apps", Resource: "deployments", SubResource: "status", Namespace: "a"},
	} {
		if set.Guards(&r, env) {
			t.Errorf("\"*\" covers %s/%s/%s", r.Group, r.Resource, r.SubResource)
		}
	}
	if r := (Request{Operation: Update, Group: "", Resource: "configmaps", Namespace: "a"}); !set.Guards(&r, env) {
		t.Error("\"*\" does not cover configmaps")
	}
}

func TestCompileErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name string
		spec v1alpha1.ConcurrencyPolicySpec
		want string
	}{
		{"an empty match", v1alpha1.ConcurrencyPolicySpec{RequireResourceVersion: true}, "spec.match.resources"},
		{"an unknown action", v1alpha1.ConcurrencyPolicySpec{Action: "Block", Match: deployments(), RequireResourceVersion: true}, `spec.action: Unsupported value: "Block"`},
		{"a bad path", v1alpha1.ConcurrencyPolicySpec{Match: deployments(), ImmutableFields: []v1alpha1.ImmutableField{{Path: "spec..x"}}}, "spec.immutableFields[0].path"},
		{"a field owner without writers", v1alpha1.ConcurrencyPolicySpec{Match: deployments(), FieldOwners: []v1alpha1.FieldOwner{{Path: "spec.replicas"}}}, "spec.fieldOwners[0].writers"},
		{"a malformed service account", v1alpha1.ConcurrencyPolicySpec{Match: deployments(), FieldOwners: []v1alpha1.FieldOwner{{Path: "spec.replicas", Writers: v1alpha1.Writers{ServiceAccounts: []string{"hpa"}}}}}, "spec.fieldOwners[0].writers.serviceAccounts[0]"},
		{"a policy without rules", v1alpha1.ConcurrencyPolicySpec{Match: deployments()}, "enforces nothing"},
		{"an unknown delete precondition", v1alpha1.ConcurrencyPolicySpec{Match: deployments(), RequireDeletePreconditions: "etag"}, "spec.requireDeletePreconditions"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compile(&v1alpha1.ConcurrencyPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: c.spec})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestNamespaceIndexKeepsTheSetsOrder: a set of per-namespace policies
// and policies on every namespace names, for a request, exactly the
// policies covering its namespace, in the set's (name) order, each once.
func TestNamespaceIndexKeepsTheSetsOrder(t *testing.T) {
	var ps []*Policy
	for _, c := range []struct {
		name string
		nss  []string
	}{{"a-all", nil}, {"b-shop", []string{"shop"}}, {"c-other", []string{"other"}}, {"d-both", []string{"shop", "other", "shop"}}, {"e-all", nil}, {"f-shop", []string{"shop"}}} {
		m := deployments()
		m.Namespaces = c.nss
		ps = append(ps, mustCompile(t, c.name, v1alpha1.ConcurrencyPolicySpec{Match: m, RequireResourceVersion: true}))
	}
	set := NewSet(ps[5], ps[3], ps[0], ps[4], ps[1], ps[2])
	for ns, want := range map[string]string{"shop": "a-all b-shop d-both e-all f-shop", "other": "a-all c-other d-both e-all", "web": "a-all e-all"} {
		d, err := set.CheckStamp(&Request{Operation: Update, Group: "apps", Resource: "deployments", Namespace: ns, Object: deploy("1", "", "")}, &Environment{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range d.Violations {
			got = append(got, v.Policy)
		}
		if strings.Join(got, " ") != want {
			t.Errorf("namespace %s: %q, want %q", ns, strings.Join(got, " "), want)
		}
	}
}
