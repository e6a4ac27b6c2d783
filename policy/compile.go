package policy

import (
	"fmt"
	"iter"
	"slices"
	"strconv"
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

// ruleKinds lists the kinds of rule. A policy's rules are compiled in this
// order, then in the order of the spec's lists, and that is the order in
// which they are checked and written into the pre-filter. A new kind is a
// file and a line here.
var ruleKinds = []*ruleKind{&stampKind, &ownerKind, &immutableKind, &deleteKind}

// ruleKind describes a kind of rule.
type ruleKind struct {
	kind RuleKind
	// field is the spec's field that holds the rule, or with list the
	// rules (then each is named field[i]).
	field string
	list  bool
	// compile turns the kind's fields of spec into rules; inherited is the
	// policy's action, spec the spec's path.
	compile func(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) []rule
}

// name names a rule of the kind in the spec's words.
func (k *ruleKind) name(index int) string {
	if !k.list {
		return k.field
	}
	return k.field + "[" + strconv.Itoa(index) + "]"
}

// rule is one compiled rule of a policy, each kind in its own file. As
// cert-manager's admission PluginChain loops over its plugins, compile,
// check, pre-filter and replay loop over a policy's rules.
type rule interface {
	// phase is the webhook that checks the rule.
	phase() phase
	// operations are what the rule checks. The slice is shared: never
	// modify it.
	operations() []Operation
	// onScale reports whether the rule is checked on the scale subresource
	// of a workload that its policy guards (matchScope replicasOnly): a
	// Scale carries the workload's stamp and spec.replicas, nothing else.
	onScale() bool
	// paths are the fields the rule reads from the objects; a Set extracts
	// those of all its rules in one pass over each object.
	paths() []FieldPath
	// condition is the rule's part of its policy's term in the phase's
	// pre-filter: CEL that is true whenever check could find a violation
	// in a request the policy applies to.
	condition() string
	// ref names the rule; the caller fills in the policy.
	ref() RuleRef
	// check evaluates the rule for a request that its policy applies to
	// and that it checks (checks).
	check(ev *evaluation, policy string) (Violation, bool, error)
}

// checks reports whether r is evaluated for an operation under a scope.
func checks(r rule, op Operation, scope matchScope) bool {
	return slices.Contains(r.operations(), op) && (scope == fullMatch || (scope == replicasOnly && r.onScale()))
}

// phase is the admission webhook that checks a rule.
type phase uint8

const (
	// phaseStamp is the mutating webhook: only it still sees an update
	// without its resourceVersion.
	phaseStamp phase = iota
	// phaseFields is the validating webhook.
	phaseFields
)

// Operation lists, shared by the rules' operations.
var (
	updates           = []Operation{Update}
	updatesAndCreates = []Operation{Update, Create}
	deletes           = []Operation{Delete}
)

// Policy is a compiled ConcurrencyPolicy. It is immutable.
type Policy struct {
	Name string

	resources         []resourceMatcher
	namespaces        []string // empty: all but the protected ones
	namespaceSelector labels.Selector
	selectorSource    *metav1.LabelSelector // as written, for the webhook's namespaceSelector
	excludeUsers      []string
	excludeGroups     []string

	rules []rule // in the order of ruleKinds
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

	for _, k := range ruleKinds {
		out.rules = append(out.rules, k.compile(&p.Spec, action, spec, &errs)...)
	}
	if len(out.rules) == 0 {
		errs = append(errs, field.Required(spec, "the policy enforces nothing: set "+ruleFields()))
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return out, nil
}

// ruleFields lists the spec's rule fields: "a, b or c".
func ruleFields() string {
	var b strings.Builder
	for i, k := range ruleKinds {
		switch {
		case i == 0:
		case i == len(ruleKinds)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(k.field)
	}
	return b.String()
}

// rulesIn yields the policy's rules of a phase, in order.
func (p *Policy) rulesIn(ph phase) iter.Seq[rule] {
	return func(yield func(rule) bool) {
		for _, r := range p.rules {
			if r.phase() == ph && !yield(r) {
				return
			}
		}
	}
}

// has reports whether the policy has a rule in a phase.
func (p *Policy) has(ph phase) bool {
	return slices.ContainsFunc(p.rules, func(r rule) bool { return r.phase() == ph })
}

// checksOperation reports whether a rule of the phase checks op in some
// scope: a cheap test before applies.
func (p *Policy) checksOperation(ph phase, op Operation) bool {
	return slices.ContainsFunc(p.rules, func(r rule) bool { return r.phase() == ph && slices.Contains(r.operations(), op) })
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
