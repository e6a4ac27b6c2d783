package policy

import (
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The immutable field rule (spec.immutableFields[i]): nobody may change
// the field on an update (Always), or once it is set (OnceSet).

// RuleImmutableField is the immutable field rule's kind and audit
// annotation key.
const RuleImmutableField RuleKind = annotation.ImmutableField

// immutableRuleName names the rule in the spec's words.
func immutableRuleName(i int) string { return "immutableFields[" + strconv.Itoa(i) + "]" }

type immutableRule struct {
	index  int
	path   FieldPath
	mode   v1alpha1.ImmutableMode
	action v1alpha1.Action
}

func compileImmutable(i int, im v1alpha1.ImmutableField, inherited v1alpha1.Action, ip *field.Path, errs *field.ErrorList) immutableRule {
	path, err := ParseFieldPath(im.Path)
	if err != nil {
		*errs = append(*errs, field.Invalid(ip.Child("path"), im.Path, err.Error()))
	}
	mode := im.Mode
	switch mode {
	case "":
		mode = v1alpha1.ImmutableAlways
	case v1alpha1.ImmutableAlways, v1alpha1.ImmutableOnceSet:
	default:
		*errs = append(*errs, field.NotSupported(ip.Child("mode"), mode, []string{"Always", "OnceSet"}))
	}
	return immutableRule{
		index: i, path: path, mode: mode,
		action: checkAction(im.Action, inherited, ip.Child("action"), errs),
	}
}

// checks reports whether the rule is evaluated: on a workload's scale
// subresource only for spec.replicas.
func (r *immutableRule) checks(scope matchScope) bool {
	return scope != replicasOnly || r.path.pathIs("spec", "replicas")
}

func (ev *fieldEvaluation) checkImmutables(p *Policy, scope matchScope, d *Decision) error {
	for i := range p.immutables {
		r := &p.immutables[i]
		if !r.checks(scope) {
			continue
		}
		old, cur, err := ev.values(r.path)
		if err != nil {
			return err
		}
		if sameValues(old, cur) || (r.mode == v1alpha1.ImmutableOnceSet && len(old) == 0) {
			continue
		}
		what := "immutable"
		if r.mode == v1alpha1.ImmutableOnceSet {
			what = "immutable once set"
		}
		d.Violations = append(d.Violations, Violation{
			Policy: p.Name, Rule: RuleImmutableField, Index: r.index, Action: r.action,
			Path: r.path.text, Writer: ev.req.User.Name,
			Message: "ConcurrencyPolicy " + strconv.Quote(p.Name) + ": " + r.path.text + " is " + what + "; " +
				ev.req.User.Name + " may not change it (" + showValues(old) + " -> " + showValues(cur) + ")",
		})
	}
	return nil
}

// immutableCondition: the field changed (and, for OnceSet, was set before).
func immutableCondition(r immutableRule) string {
	v, ok := compilePath(r.path)
	if !ok {
		return "true"
	}
	terms := []string{"request.operation == 'UPDATE'", v.old + " != " + v.cur}
	if r.mode == v1alpha1.ImmutableOnceSet {
		terms = append(terms, v.oldSet)
	}
	return and(terms...)
}

// operations are what the rule checks: updates.
func (*immutableRule) operations() []Operation { return []Operation{Update} }
