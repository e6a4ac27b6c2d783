package admission

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The big deployment and its update review are admissiontest's, shared with
// cmd/webhook/app; the policies over them below are this package's own.

// tenRules is one policy with ten rules over the big deployment, all of
// which read their values on every update.
func tenRules(t testing.TB) *policy.Set { return policy.NewSet(tenRulesPolicy(t)) }

func tenRulesPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	hpa := v1alpha1.Writers{ServiceAccounts: []string{"kube-system/horizontal-pod-autoscaler"}}
	deployers := v1alpha1.Writers{Groups: []string{"deployers"}, Users: []string{"argocd"}}
	p, err := policy.Compile(&v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deployments"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}},
			FieldOwners: []v1alpha1.FieldOwner{
				{Path: "spec.replicas", Writers: hpa},
				{Path: "spec.template.spec.containers[name=app].image", Writers: deployers, Action: v1alpha1.ActionWarn},
				{Path: "spec.template.spec.containers[name=sidecar].image", Writers: deployers},
				{Path: `spec.template.metadata.annotations["checksum/config"]`, Writers: deployers},
				{Path: "spec.minReadySeconds", Writers: deployers},
			},
			ImmutableFields: []v1alpha1.ImmutableField{
				{Path: `metadata.labels["team"]`},
				{Path: "spec.selector"},
				{Path: "spec.template.spec.serviceAccountName"},
				{Path: "spec.template.spec.containers[*].name"},
				{Path: `metadata.annotations["owner"]`, Mode: v1alpha1.ImmutableOnceSet},
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stampPolicy() *v1alpha1.ConcurrencyPolicy {
	return &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "stamp"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}},
			RequireResourceVersion: true,
		},
	}
}
