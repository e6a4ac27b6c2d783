package webhookconfig

import (
	"reflect"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy/admission/admissiontest"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

func TestConfigurationsPrefilter(t *testing.T) {
	base := ConfigOptions{URL: "https://127.0.0.1:9443", NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"stampguard.dev/guarded": "yes"},
	}}
	owners := &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "owners"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:       v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}, Namespaces: []string{"web"}},
			FieldOwners: []v1alpha1.FieldOwner{{Path: "spec.replicas", Writers: v1alpha1.Writers{Users: []string{"hpa"}}}},
		},
	}

	// What every selector starts with: the excluded namespaces, the exempt
	// label, then base's own selector.
	exclusions := []metav1.LabelSelectorRequirement{
		{Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kube-node-lease"}},
		{Key: ExemptLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}},
	}
	baseSel := &metav1.LabelSelector{MatchLabels: map[string]string{"stampguard.dev/guarded": "yes"}, MatchExpressions: exclusions}

	t.Run("without policies nothing is routed", func(t *testing.T) {
		mut, val := Configurations(base)
		if len(mut.Webhooks[0].Rules)+len(val.Webhooks[0].Rules) != 0 {
			t.Fatalf("rules %+v and %+v", mut.Webhooks[0].Rules, val.Webhooks[0].Rules)
		}
		if val.Webhooks[0].NamespaceSelector != nil || len(val.Webhooks[0].MatchConditions) != 0 {
			t.Fatalf("namespaceSelector %v, conditions %v: want neither", val.Webhooks[0].NamespaceSelector, val.Webhooks[0].MatchConditions)
		}
	})

	t.Run("with RouteAll every guarded write is routed, whatever the policies", func(t *testing.T) {
		o := base
		o.RouteAll = true
		o.Policies = admissiontest.CompileSet(t, owners)
		mut, val := Configurations(o)
		if got := admissiontest.ConditionNames(val.Webhooks[0].MatchConditions); !slices.Equal(got, []string{"not-helm-release", "not-break-glass"}) {
			t.Fatalf("validating conditions %v", got)
		}
		if got := admissiontest.ConditionNames(mut.Webhooks[0].MatchConditions); !slices.Equal(got, []string{"stampless-update", "not-helm-release", "not-break-glass"}) {
			t.Fatalf("mutating conditions %v", got)
		}
		if n := len(val.Webhooks[0].Rules); n != len(DefaultGuardedResources) {
			t.Fatalf("want a rule per default resource, got %d", n)
		}
		if !reflect.DeepEqual(val.Webhooks[0].NamespaceSelector, baseSel) {
			t.Fatalf("namespaceSelector %v, want %v", val.Webhooks[0].NamespaceSelector, baseSel)
		}
	})

	t.Run("with policies each webhook routes only what they guard", func(t *testing.T) {
		o := base
		o.Policies = admissiontest.CompileSet(t, owners)
		mut, val := Configurations(o)
		vw := val.Webhooks[0]
		if got := admissiontest.ConditionNames(vw.MatchConditions); !slices.Equal(got, []string{FieldsPolicyCondition, "not-helm-release", "not-break-glass"}) {
			t.Fatalf("validating conditions %v", got)
		}
		want := []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"*"},
				Resources: []string{"deployments", "deployments/scale"}, Scope: ptrTo(admissionregistrationv1.AllScopes)},
		}}
		if !reflect.DeepEqual(vw.Rules, want) {
			t.Fatalf("rules %+v, want %+v", vw.Rules, want)
		}
		wantSel := &metav1.LabelSelector{MatchExpressions: append([]metav1.LabelSelectorRequirement{
			{Key: "stampguard.dev/guarded", Operator: metav1.LabelSelectorOpIn, Values: []string{"yes"}}}, append(exclusions,
			metav1.LabelSelectorRequirement{Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}})...)}
		if !reflect.DeepEqual(vw.NamespaceSelector, wantSel) {
			t.Fatalf("namespaceSelector %v, want %v", vw.NamespaceSelector, wantSel)
		}
		// No stamp policy: the stamp webhook routes nothing.
		if len(mut.Webhooks[0].Rules) != 0 {
			t.Fatalf("stamp webhook routes %+v", mut.Webhooks[0].Rules)
		}
		mut2, val2 := Configurations(o)
		if !reflect.DeepEqual(mut, mut2) || !reflect.DeepEqual(val, val2) {
			t.Fatal("two compilations of the same set differ; replicas would fight over the objects")
		}
	})

	t.Run("a namespace name no namespace can have is left out of the selector", func(t *testing.T) {
		bad := owners.DeepCopy()
		bad.Spec.Match.Namespaces = []string{"Team_A", "web"}
		o := base
		o.Policies = admissiontest.CompileSet(t, bad)
		_, val := Configurations(o)
		sel := val.Webhooks[0].NamespaceSelector
		if r := sel.MatchExpressions[len(sel.MatchExpressions)-1]; r.Key != namespaceNameLabel || !slices.Equal(r.Values, []string{"web"}) {
			t.Fatalf("namespaceSelector %v, want the name requirement with web only", sel)
		}
	})

	t.Run("a wildcard policy narrows by namespace while namespaces are not routed", func(t *testing.T) {
		o := base
		o.Policies = admissiontest.CompileSet(t, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "all"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "*", Resource: "*"}}},
				RequireResourceVersion: true,
			},
		})
		mut, _ := Configurations(o)
		// The protected namespaces are excluded already: nothing to add.
		if want := baseSel; !reflect.DeepEqual(mut.Webhooks[0].NamespaceSelector, want) {
			t.Fatalf("namespaceSelector %v, want %v", mut.Webhooks[0].NamespaceSelector, want)
		}
	})

	t.Run("a policy that guards namespaces themselves does not narrow by namespace", func(t *testing.T) {
		o := base
		o.Resources = append(slices.Clone(DefaultGuardedResources), GuardedResource{Resource: "namespaces"})
		o.Policies = admissiontest.CompileSet(t, owners, &v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "all"},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "*", Resource: "*"}}, Namespaces: []string{"web"}},
				RequireResourceVersion: true,
			},
		})
		mut, _ := Configurations(o)
		if !reflect.DeepEqual(mut.Webhooks[0].NamespaceSelector, baseSel) {
			t.Fatalf("namespaceSelector %v narrowed although a namespace object matches by its own labels", mut.Webhooks[0].NamespaceSelector)
		}
		if got := admissiontest.ConditionNames(mut.Webhooks[0].MatchConditions); !slices.Equal(got, []string{"stampless-update", StampPolicyCondition, "not-helm-release", "not-break-glass"}) {
			t.Fatalf("mutating conditions %v", got)
		}
	})
}

func ptrTo[T any](v T) *T { return &v }
