package policy

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/internal/rawjson"
)

// The stamp rule (spec.requireResourceVersion): an update must carry the
// resourceVersion it read. Only the mutating phase can see this; by the
// validating phase the apiserver has filled the stored stamp in.

// RuleStampMissing is the stamp rule's kind and audit annotation key.
const RuleStampMissing RuleKind = annotation.StampMissing

// stampRuleName names the rule in the spec's words.
const stampRuleName = "requireResourceVersion"

// StampMissingDetail is what the stamp rule says of metadata.resourceVersion
// when an update lacks it: the apiserver's own words for a custom resource
// updated without one, so that clients read both alike.
const StampMissingDetail = `Invalid value: "": must be specified for an update`

// StamplessCondition is the stamp webhook's matchCondition: the apiserver
// skips the mutating call for every update that carries a resourceVersion,
// which is nearly all of them.
const StamplessCondition = `!has(object.metadata.resourceVersion) || object.metadata.resourceVersion == ''`

type stampRule struct{ action v1alpha1.Action }

func compileStamp(spec *v1alpha1.ConcurrencyPolicySpec, inherited v1alpha1.Action, path *field.Path, errs *field.ErrorList) *stampRule {
	if !spec.RequireResourceVersion {
		return nil
	}
	return &stampRule{action: checkAction(spec.RequireResourceVersionAction, inherited, path.Child("requireResourceVersionAction"), errs)}
}

// stampCondition is the part of a policy's term in the stamp webhook's
// condition that is the rule's own: none, StamplessCondition says it.
func stampCondition(*stampRule) string { return "true" }

// CheckStamp evaluates the stamp rule: the mutating phase.
func (s *Set) CheckStamp(req *Request, env *Environment) (Decision, error) {
	var d Decision
	if req.Operation != Update {
		return d, nil
	}
	stampChecked, stamped := false, false
	for _, p := range s.policies {
		// A policy on a workload also guards its scale subresource: a Scale
		// carries the workload's resourceVersion, and a stampless Scale PUT
		// overwrites spec.replicas unconditionally.
		if p.stamp == nil || p.applies(req, env) == noMatch {
			continue
		}
		if !stampChecked {
			var err error
			stamped, err = s.hasStamp(req)
			if err != nil {
				return d, err
			}
			stampChecked = true
		}
		if stamped {
			return d, nil
		}
		d.Violations = append(d.Violations, Violation{
			Policy: p.Name, Rule: RuleStampMissing, Index: -1, Action: p.stamp.action,
			Path: "metadata.resourceVersion", Writer: req.User.Name,
			Message: "ConcurrencyPolicy " + strconv.Quote(p.Name) + ": metadata.resourceVersion: " + StampMissingDetail,
		})
	}
	return d, nil
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
