package policy

import (
	"fmt"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The delete rule (spec.requireDeletePreconditions): a delete must carry a
// uid or resourceVersion precondition. It reads the DeleteOptions only.

// RuleDeletePrecondition is the delete rule's kind and audit annotation key.
const RuleDeletePrecondition RuleKind = annotation.DeletePrecondition

var deleteKind = ruleKind{kind: RuleDeletePrecondition, field: "requireDeletePreconditions", compile: compileDelete}

// Default exemptions from requireDeletePreconditions: these controllers
// delete by name in bulk and cannot know a uid for every object.
var defaultDeleteExemptUsers = []string{
	"system:serviceaccount:kube-system:namespace-controller",
	"system:serviceaccount:kube-system:generic-garbage-collector",
}

type deleteRule struct {
	require          v1alpha1.DeletePrecondition
	action           v1alpha1.Action
	exemptUsers      []string
	collectionExempt bool
}

var _ rule = (*deleteRule)(nil)

func compileDelete(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) []rule {
	switch d := spec.RequireDeletePreconditions; d {
	case "", v1alpha1.DeletePreconditionNone:
		return nil
	case v1alpha1.DeletePreconditionUID, v1alpha1.DeletePreconditionResourceVersion:
		r := &deleteRule{
			require:          d,
			action:           checkAction(spec.DeletePreconditionsAction, inherited, path.Child("deletePreconditionsAction"), errs),
			exemptUsers:      defaultDeleteExemptUsers,
			collectionExempt: spec.DeleteCollectionExempt == nil || *spec.DeleteCollectionExempt,
		}
		if spec.DeletePreconditionExemptUsers != nil {
			r.exemptUsers = sortedCopy(*spec.DeletePreconditionExemptUsers)
		}
		return []rule{r}
	default:
		*errs = append(*errs, field.NotSupported(path.Child("requireDeletePreconditions"), d, []string{"none", "uid", "resourceVersion"}))
		return nil
	}
}

func (*deleteRule) phase() phase            { return phaseFields }
func (*deleteRule) operations() []Operation { return deletes }
func (*deleteRule) paths() []FieldPath      { return nil } // it reads the DeleteOptions only
func (r *deleteRule) ref() RuleRef {
	return RuleRef{Rule: RuleDeletePrecondition, Index: -1, Action: r.action}
}

// onScale: a Scale is never deleted.
func (*deleteRule) onScale() bool { return false }

func (r *deleteRule) check(ev *evaluation, policy string) (Violation, bool, error) {
	if slices.Contains(r.exemptUsers, ev.req.User.Name) {
		return Violation{}, false, nil
	}
	if ev.req.Name == "" && r.collectionExempt {
		return Violation{}, false, nil // an item of a deletecollection: it cannot carry preconditions
	}
	uid, rv, err := preconditions(ev.req.Options)
	if err != nil {
		return Violation{}, false, err
	}
	want, have := "uid", uid
	if r.require == v1alpha1.DeletePreconditionResourceVersion {
		want, have = "resourceVersion", rv
	}
	if have != "" {
		return Violation{}, false, nil
	}
	return Violation{
		Policy: policy, Rule: RuleDeletePrecondition, Index: -1, Action: r.action,
		Path: "preconditions." + want, Writer: ev.req.User.Name,
		Message: "ConcurrencyPolicy " + strconv.Quote(policy) + ": deletes of " + resourceName(ev.req.Group, ev.req.Resource) +
			" must carry a " + want + " precondition; " + ev.req.User.Name + " sent none",
	}, true, nil
}

func preconditions(options []byte) (uid, rv string, err error) {
	if rawjson.Kind(options) != '{' {
		return "", "", nil
	}
	pre, ok, err := rawjson.Member(options, "preconditions")
	if err != nil || !ok || rawjson.Kind(pre) != '{' {
		return "", "", err
	}
	err = rawjson.ObjectEach(pre, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "uid"):
			uid, err = rawjson.String(v)
		case rawjson.KeyIs(k, "resourceVersion"):
			rv, err = rawjson.String(v)
		}
		return err == nil
	})
	if err != nil {
		return "", "", fmt.Errorf("read delete preconditions: %w", err)
	}
	return uid, rv, nil
}

// condition: a delete by someone not exempt without the precondition.
func (r *deleteRule) condition() string {
	terms := []string{"request.operation == 'DELETE'"}
	if len(r.exemptUsers) > 0 {
		terms = append(terms, "!("+reqUser+" in "+celList(r.exemptUsers)+")")
	}
	if r.collectionExempt {
		terms = append(terms, reqName+" != ''")
	}
	key := "uid"
	if r.require == v1alpha1.DeletePreconditionResourceVersion {
		key = "resourceVersion"
	}
	v := "request.?options.?preconditions.?" + key + ".orValue('')"
	// Anything but a non-empty string counts as missing: the evaluator
	// refuses what it cannot read.
	terms = append(terms, "(type("+v+") != string || "+v+" == '')")
	return and(terms...)
}
