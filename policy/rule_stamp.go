package policy

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The stamp rule (spec.requireResourceVersion): an update must carry the
// resourceVersion it read. Only the mutating phase can see this; by the
// validating phase the apiserver has filled the stored stamp in.

// RuleStampMissing is the stamp rule's kind and audit annotation key.
const RuleStampMissing RuleKind = annotation.StampMissing

var stampKind = ruleKind{kind: RuleStampMissing, field: "requireResourceVersion", compile: compileStamp}

// StampMissingDetail is what the stamp rule says of metadata.resourceVersion
// when an update lacks it: the apiserver's own words for a custom resource
// updated without one, so that clients read both alike.
const StampMissingDetail = `Invalid value: "": must be specified for an update`

// StamplessCondition is the stamp webhook's matchCondition: the apiserver
// skips the mutating call for every update that carries a resourceVersion,
// which is nearly all of them.
const StamplessCondition = `!has(object.metadata.resourceVersion) || object.metadata.resourceVersion == ''`

type stampRule struct{ action v1alpha1.Action }

var _ rule = (*stampRule)(nil)

func compileStamp(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) []rule {
	if !spec.RequireResourceVersion {
		return nil
	}
	return []rule{&stampRule{action: checkAction(spec.RequireResourceVersionAction, inherited, path.Child("requireResourceVersionAction"), errs)}}
}

func (*stampRule) phase() phase            { return phaseStamp }
func (*stampRule) operations() []Operation { return updates }
func (*stampRule) paths() []FieldPath      { return []FieldPath{resourceVersionPath} }
func (r *stampRule) ref() RuleRef {
	return RuleRef{Rule: RuleStampMissing, Index: -1, Action: r.action}
}

// onScale: a policy on a workload also guards its scale subresource: a
// Scale carries the workload's resourceVersion, and a stampless Scale PUT
// overwrites spec.replicas unconditionally.
func (*stampRule) onScale() bool { return true }

// condition is the rule's own part of a policy's term in the stamp
// webhook's condition: none, StamplessCondition says it.
func (*stampRule) condition() string { return "true" }

func (r *stampRule) check(ev *evaluation, policy string) (Violation, bool, error) {
	if !ev.stampRead {
		stamped, err := ev.set.hasStamp(ev.req)
		if err != nil {
			return Violation{}, false, err
		}
		ev.stampRead, ev.stamped = true, stamped
	}
	if ev.stamped {
		return Violation{}, false, nil
	}
	return Violation{
		Policy: policy, Rule: RuleStampMissing, Index: -1, Action: r.action,
		Path: "metadata.resourceVersion", Writer: ev.req.User.Name,
		Message: "ConcurrencyPolicy " + strconv.Quote(policy) + ": metadata.resourceVersion: " + StampMissingDetail,
	}, true, nil
}

var resourceVersionPath = mustPath("metadata.resourceVersion")

func (s *Set) hasStamp(req *Request) (bool, error) {
	var vals [][]byte
	if req.scanned[curObject] {
		vals = valuesOf(req.extracted[curObject], s.index[resourceVersionPath.text], nil)
	} else {
		var err error
		if vals, err = resourceVersionPath.Values(req.Object, nil); err != nil {
			return false, fmt.Errorf("read metadata.resourceVersion: %w", err)
		}
	}
	if len(vals) == 0 {
		return false, nil
	}
	rv, err := rawjson.String(vals[0])
	if err != nil {
		return false, fmt.Errorf("read metadata.resourceVersion: %w", err)
	}
	return rv != "", nil
}
