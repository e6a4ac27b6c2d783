package webhookconfig

import (
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/stampguard/stampguard/policy"
)

// Names of the match conditions the pre-filter adds.
const (
	// StampPolicyCondition: a stamp policy applies to the request.
	StampPolicyCondition = "stamp-policy-applies"
	// FieldsPolicyCondition: the write could break a field, delete or
	// create rule of a policy.
	FieldsPolicyCondition = "could-break-a-policy"
)

// namespaceNameLabel is the label the apiserver sets on every namespace.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// narrow applies the pre-filter compiled from o.Policies to the two
// webhooks. The conditions are ANDed with the others, so each webhook gets
// one condition, an OR over its policies' rules.
func (o *ConfigOptions) narrow(mut *admissionregistrationv1.MutatingWebhookConfiguration, val *admissionregistrationv1.ValidatingWebhookConfiguration) {
	pf := o.prefilter()

	mw := &mut.Webhooks[0]
	mw.Rules = filterRules(pf.Stamp)
	mw.NamespaceSelector = o.namespaceSelector(pf.Stamp)
	mw.MatchConditions = insertCondition(mw.MatchConditions, 1, StampPolicyCondition, pf.Stamp.Condition)

	vw := &val.Webhooks[0]
	vw.Rules = filterRules(pf.Fields)
	vw.NamespaceSelector = o.namespaceSelector(pf.Fields)
	vw.MatchConditions = insertCondition(vw.MatchConditions, 0, FieldsPolicyCondition, pf.Fields.Condition)
}

// prefilter compiles o.Policies for o's resources; o has its defaults.
func (o *ConfigOptions) prefilter() policy.Prefilter {
	resources := make([]schema.GroupResource, len(o.Resources))
	for i, r := range o.Resources {
		resources[i] = schema.GroupResource{Group: r.Group, Resource: r.Resource}
	}
	return o.Policies.Prefilter(policy.PrefilterOptions{Resources: resources, ProtectedNamespaces: o.ProtectedNamespaces})
}

// insertCondition puts a compiled condition at position i; one that is
// always true says nothing and is left out.
func insertCondition(cs []admissionregistrationv1.MatchCondition, i int, name, expr string) []admissionregistrationv1.MatchCondition {
	if expr == "true" {
		return cs
	}
	out := make([]admissionregistrationv1.MatchCondition, 0, len(cs)+1)
	out = append(out, cs[:i]...)
	out = append(out, admissionregistrationv1.MatchCondition{Name: name, Expression: expr})
	return append(out, cs[i:]...)
}

// filterRules lists one rule per API group, resources in the filter's order.
func filterRules(f policy.WebhookFilter) []admissionregistrationv1.RuleWithOperations {
	ops := make([]admissionregistrationv1.OperationType, len(f.Operations))
	for i, op := range f.Operations {
		ops[i] = admissionregistrationv1.OperationType(op)
	}
	byGroup := map[string][]string{}
	var groups []string
	for _, r := range f.Resources {
		if _, seen := byGroup[r.Group]; !seen {
			groups = append(groups, r.Group)
		}
		byGroup[r.Group] = append(byGroup[r.Group], r.Resource)
	}
	scope := admissionregistrationv1.AllScopes
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(groups))
	for _, g := range groups {
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{g}, APIVersions: []string{"*"}, Resources: byGroup[g], Scope: &scope,
			},
		})
	}
	return out
}

// namespaceSelector ANDs the base selector (exclusions and the configured
// selector) with the filter's namespaces and its only policy's selector.
func (o *ConfigOptions) namespaceSelector(f policy.WebhookFilter) *metav1.LabelSelector {
	parts := []*metav1.LabelSelector{o.baseSelector()}
	switch {
	case f.Namespaces != nil:
		parts = append(parts, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: f.Namespaces,
		}}})
	case f.ExcludedNamespaces != nil && !subset(f.ExcludedNamespaces, o.ExcludedNamespaces):
		parts = append(parts, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: f.ExcludedNamespaces,
		}}})
	}
	if f.NamespaceSelector != nil {
		parts = append(parts, f.NamespaceSelector)
	}
	if len(parts) == 1 {
		return parts[0]
	}
	// A selector's requirements are ANDed; matchLabels become In
	// requirements so that two selectors never clash on a key.
	out := &metav1.LabelSelector{}
	for _, p := range parts {
		for _, k := range sortedKeys(p.MatchLabels) {
			out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{p.MatchLabels[k]},
			})
		}
		for _, r := range p.MatchExpressions {
			out.MatchExpressions = append(out.MatchExpressions, *r.DeepCopy())
		}
	}
	return out
}

// subset: every name of a is in b.
func subset(a, b []string) bool {
	for _, n := range a {
		if !slices.Contains(b, n) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
