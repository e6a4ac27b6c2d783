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

var immutableKind = ruleKind{kind: RuleImmutableField, field: "immutableFields", list: true, compile: compileImmutables}

type immutableRule struct {
	index  int
	path   FieldPath
	mode   v1alpha1.ImmutableMode
	action v1alpha1.Action
}

var _ rule = (*immutableRule)(nil)

func compileImmutables(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) []rule {
	var out []rule
	for i, im := range spec.ImmutableFields {
		out = append(out, compileImmutable(i, im, inherited, path.Child("immutableFields").Index(i), errs))
	}
	return out
}

func compileImmutable(i int, im v1alpha1.ImmutableField, inherited v1alpha1.Action, ip *field.Path, errs *field.ErrorList) *immutableRule {
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
	return &immutableRule{
		index: i, path: path, mode: mode,
		action: checkAction(im.Action, inherited, ip.Child("action"), errs),
	}
}

func (*immutableRule) phase() phase            { return phaseFields }
func (*immutableRule) operations() []Operation { return updates }
func (r *immutableRule) paths() []FieldPath    { return []FieldPath{r.path} }
func (r *immutableRule) ref() RuleRef {
	return RuleRef{Rule: RuleImmutableField, Index: r.index, Action: r.action}
}

// onScale: a Scale carries spec.replicas.
func (r *immutableRule) onScale() bool { return r.path.pathIs("spec", "replicas") }

func (r *immutableRule) check(ev *evaluation, policy string) (Violation, bool, error) {
	old, cur, err := ev.values(r.path)
	if err != nil {
		return Violation{}, false, err
	}
	if sameValues(old, cur) || (r.mode == v1alpha1.ImmutableOnceSet && len(old) == 0) {
		return Violation{}, false, nil
	}
	what := "immutable"
	if r.mode == v1alpha1.ImmutableOnceSet {
		what = "immutable once set"
	}
	return Violation{
		Policy: policy, Rule: RuleImmutableField, Index: r.index, Action: r.action,
		Path: r.path.text, Writer: ev.req.User.Name,
		Message: "ConcurrencyPolicy " + strconv.Quote(policy) + ": " + r.path.text + " is " + what + "; " +
			ev.req.User.Name + " may not change it (" + showValues(old) + " -> " + showValues(cur) + ")",
	}, true, nil
}

// condition: the field changed (and, for OnceSet, was set before).
func (r *immutableRule) condition() string {
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
