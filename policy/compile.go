package policy

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// RuleKind names a kind of rule; it is also the audit annotation key (the
// apiserver prefixes the webhook name). Each kind is defined in its rule's
// file (rule_*.go), with its compile, its check and its condition.
type RuleKind string

// Policy is a compiled ConcurrencyPolicy. It is immutable.
type Policy struct {
	Name string

	resources         []resourceMatcher
	namespaces        []string // empty: all but the protected ones
	namespaceSelector labels.Selector
	selectorSource    *metav1.LabelSelector // as written, for the webhook's namespaceSelector
	excludeUsers      []string
	excludeGroups     []string

	stamp      *stampRule
	delete     *deleteRule
	owners     []ownerRule
	immutables []immutableRule
}

// Compile checks a policy and turns it into its evaluable form. The error
// is a field.ErrorList aggregate whose entries name the offending field.
func Compile(p *v1alpha1.ConcurrencyPolicy) (*Policy, error) {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	out := &Policy{Name: p.Name}
	if p.Name == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "name"), "a policy needs a name"))
	}

	action := checkAction(p.Spec.Action, v1alpha1.ActionDeny, spec.Child("action"), &errs)

	m := p.Spec.Match
	mp := spec.Child("match")
	if len(m.Resources) == 0 {
		errs = append(errs, field.Required(mp.Child("resources"), "an empty match would guard nothing; name at least one resource"))
	}
	for i, r := range m.Resources {
		rm, err := parseResource(r)
		if err != nil {
			errs = append(errs, field.Invalid(mp.Child("resources").Index(i), r, err.Error()))
			continue
		}
		out.resources = append(out.resources, rm)
	}
	for i, ns := range m.Namespaces {
		if ns == "" || ns == "*" {
			errs = append(errs, field.Invalid(mp.Child("namespaces").Index(i), ns, "name a namespace; leave the list empty for all"))
		}
	}
	out.namespaces = sortedCopy(m.Namespaces)
	if m.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(m.NamespaceSelector)
		if err != nil {
			errs = append(errs, field.Invalid(mp.Child("namespaceSelector"), m.NamespaceSelector, err.Error()))
		} else {
			out.namespaceSelector = sel
			out.selectorSource = m.NamespaceSelector.DeepCopy()
		}
	}
	out.excludeUsers = sortedCopy(m.ExcludeUsers)
	out.excludeGroups = sortedCopy(m.ExcludeGroups)

	out.stamp = compileStamp(&p.Spec, action, spec, &errs)
	out.delete = compileDelete(&p.Spec, action, spec, &errs)
	for i, fo := range p.Spec.FieldOwners {
		out.owners = append(out.owners, compileOwner(i, fo, action, spec.Child("fieldOwners").Index(i), &errs))
	}
	for i, im := range p.Spec.ImmutableFields {
		out.immutables = append(out.immutables, compileImmutable(i, im, action, spec.Child("immutableFields").Index(i), &errs))
	}
	if out.stamp == nil && out.delete == nil && len(out.owners) == 0 && len(out.immutables) == 0 {
		errs = append(errs, field.Required(spec, "the policy enforces nothing: set requireResourceVersion, requireDeletePreconditions, fieldOwners or immutableFields"))
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return out, nil
}

// fieldOperations are the operations the policy's fields-phase rules
// check, each rule saying its own.
func (p *Policy) fieldOperations() []Operation {
	var out []Operation
	for _, r := range p.owners {
		out = append(out, r.operations()...)
	}
	for _, r := range p.immutables {
		out = append(out, r.operations()...)
	}
	if p.delete != nil {
		out = append(out, p.delete.operations()...)
	}
	return out
}

func checkAction(a, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) v1alpha1.Action {
	switch a {
	case "":
		return inherited
	case v1alpha1.ActionDeny, v1alpha1.ActionWarn, v1alpha1.ActionAudit:
		return a
	}
	*errs = append(*errs, field.NotSupported(path, a, []string{"Deny", "Warn", "Audit"}))
	return inherited
}

type resourceMatcher struct {
	group, resource, sub string // "*" is a wildcard in each
}

func parseResource(r v1alpha1.ResourceMatch) (resourceMatcher, error) {
	res, sub, _ := strings.Cut(r.Resource, "/")
	if res == "" {
		return resourceMatcher{}, fmt.Errorf("resource is empty")
	}
	if strings.Contains(sub, "/") || strings.HasSuffix(r.Resource, "/") {
		return resourceMatcher{}, fmt.Errorf("want resource or resource/subresource")
	}
	if res == "*" && sub != "" {
		return resourceMatcher{}, fmt.Errorf("a subresource needs a named resource")
	}
	return resourceMatcher{group: r.Group, resource: res, sub: sub}, nil
}

// neverWildcard lists resources that "*" does not cover: high-churn kinds
// whose writers are the control plane itself.
func neverWildcard(group, resource string) bool {
	switch resource {
	case "events":
		return group == "" || group == "events.k8s.io"
	case "leases":
		return group == "coordination.k8s.io"
	}
	return false
}

func (m resourceMatcher) matches(group, resource, sub string) bool {
	if m.group != "*" && m.group != group {
		return false
	}
	if m.resource == "*" {
		return sub == "" && !neverWildcard(group, resource)
	}
	if m.resource != resource {
		return false
	}
	return m.sub == sub || (m.sub == "*" && sub != "")
}

func sortedCopy(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
