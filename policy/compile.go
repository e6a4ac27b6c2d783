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

// RuleKind names a kind of rule; it is also the audit annotation key.
type RuleKind string

// The rule kinds, each also an audit annotation key (the apiserver prefixes
// the webhook name).
const (
	RuleStampMissing       RuleKind = "stamp-missing"
	RuleFieldOwner         RuleKind = "field-owner"
	RuleImmutableField     RuleKind = "immutable-field"
	RuleDeletePrecondition RuleKind = "delete-precondition"
)

// Default exemptions from requireDeletePreconditions: these controllers
// delete by name in bulk and cannot know a uid for every object.
var defaultDeleteExemptUsers = []string{
	"system:serviceaccount:kube-system:namespace-controller",
	"system:serviceaccount:kube-system:generic-garbage-collector",
}

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

type stampRule struct{ action v1alpha1.Action }

type deleteRule struct {
	require          v1alpha1.DeletePrecondition
	action           v1alpha1.Action
	exemptUsers      []string
	collectionExempt bool
}

type ownerRule struct {
	index    int
	path     FieldPath
	writers  writers
	onCreate bool
	action   v1alpha1.Action
}

type immutableRule struct {
	index  int
	path   FieldPath
	mode   v1alpha1.ImmutableMode
	action v1alpha1.Action
}

type writers struct {
	users    []string // usernames, service accounts expanded
	groups   []string
	managers []string
	display  string
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

	if p.Spec.RequireResourceVersion {
		out.stamp = &stampRule{action: checkAction(p.Spec.RequireResourceVersionAction, action, spec.Child("requireResourceVersionAction"), &errs)}
	}

	switch d := p.Spec.RequireDeletePreconditions; d {
	case "", v1alpha1.DeletePreconditionNone:
	case v1alpha1.DeletePreconditionUID, v1alpha1.DeletePreconditionResourceVersion:
		rule := &deleteRule{
			require:          d,
			action:           checkAction(p.Spec.DeletePreconditionsAction, action, spec.Child("deletePreconditionsAction"), &errs),
			exemptUsers:      defaultDeleteExemptUsers,
			collectionExempt: p.Spec.DeleteCollectionExempt == nil || *p.Spec.DeleteCollectionExempt,
		}
		if p.Spec.DeletePreconditionExemptUsers != nil {
			rule.exemptUsers = sortedCopy(*p.Spec.DeletePreconditionExemptUsers)
		}
		out.delete = rule
	default:
		errs = append(errs, field.NotSupported(spec.Child("requireDeletePreconditions"), d, []string{"none", "uid", "resourceVersion"}))
	}

	for i, fo := range p.Spec.FieldOwners {
		fp := spec.Child("fieldOwners").Index(i)
		path, err := ParseFieldPath(fo.Path)
		if err != nil {
			errs = append(errs, field.Invalid(fp.Child("path"), fo.Path, err.Error()))
		}
		w, werrs := compileWriters(fo.Writers, fp.Child("writers"))
		errs = append(errs, werrs...)
		out.owners = append(out.owners, ownerRule{
			index: i, path: path, writers: w, onCreate: fo.OnCreate,
			action: checkAction(fo.Action, action, fp.Child("action"), &errs),
		})
	}
	for i, im := range p.Spec.ImmutableFields {
		ip := spec.Child("immutableFields").Index(i)
		path, err := ParseFieldPath(im.Path)
		if err != nil {
			errs = append(errs, field.Invalid(ip.Child("path"), im.Path, err.Error()))
		}
		mode := im.Mode
		switch mode {
		case "":
			mode = v1alpha1.ImmutableAlways
		case v1alpha1.ImmutableAlways, v1alpha1.ImmutableOnceSet:
		default:
			errs = append(errs, field.NotSupported(ip.Child("mode"), mode, []string{"Always", "OnceSet"}))
		}
		out.immutables = append(out.immutables, immutableRule{
			index: i, path: path, mode: mode,
			action: checkAction(im.Action, action, ip.Child("action"), &errs),
		})
	}
	if out.stamp == nil && out.delete == nil && len(out.owners) == 0 && len(out.immutables) == 0 {
		errs = append(errs, field.Required(spec, "the policy enforces nothing: set requireResourceVersion, requireDeletePreconditions, fieldOwners or immutableFields"))
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return out, nil
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

func compileWriters(w v1alpha1.Writers, path *field.Path) (writers, field.ErrorList) {
	var errs field.ErrorList
	var out writers
	var shown []string
	for i, sa := range w.ServiceAccounts {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, field.Invalid(path.Child("serviceAccounts").Index(i), sa, "want namespace/name"))
			continue
		}
		u := "system:serviceaccount:" + ns + ":" + name
		out.users = append(out.users, u)
		shown = append(shown, u)
	}
	for _, u := range w.Users {
		out.users = append(out.users, u)
		shown = append(shown, u)
	}
	for _, g := range w.Groups {
		out.groups = append(out.groups, g)
		shown = append(shown, "group "+g)
	}
	for _, m := range w.FieldManagers {
		out.managers = append(out.managers, m)
		shown = append(shown, "field manager "+m)
	}
	if len(shown) == 0 {
		errs = append(errs, field.Required(path, "a field owner needs at least one writer; use immutableFields for a field nobody may change"))
	}
	slices.Sort(out.users)
	slices.Sort(out.groups)
	slices.Sort(out.managers)
	out.display = strings.Join(shown, ", ")
	return out, errs
}

// allows reports whether the writer may change a field these writers own.
// Identity decides; field managers, asserted by the client, only narrow it.
func (w writers) allows(u UserInfo, fieldManager string) bool {
	hasIdentity := len(w.users) > 0 || len(w.groups) > 0
	if hasIdentity && !u.in(w.users, w.groups) {
		return false
	}
	if len(w.managers) > 0 {
		_, ok := slices.BinarySearch(w.managers, fieldManager)
		return ok
	}
	return true
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
