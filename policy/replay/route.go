package replay

import (
	"context"
	"encoding/json"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiadmission "k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// The router answers whether the apiserver would have called a webhook at
// all: the webhook configurations webhookconfig.Configurations builds for the
// policies (as the chart and --sync-configurations install them), matched
// by the apiserver's own rule and matchCondition code, and the namespace
// selector against the namespace's labels. A violation the apiserver would
// never have sent to the webhook (a Helm release record, an exempt or
// excluded namespace, the break-glass group) is no decision.
type router struct {
	stamp, fields hook
}

type hook struct {
	rules    []admissionregistrationv1.RuleWithOperations
	selector labels.Selector
	matcher  matchconditions.Matcher
}

func newRouter(o webhookconfig.ConfigOptions) (*router, error) {
	mutating, validating := webhookconfig.Configurations(o)
	m, v := mutating.Webhooks[0], validating.Webhooks[0]
	stamp, err := newHook(m.Name, "admit", m.Rules, m.NamespaceSelector, m.MatchConditions)
	if err != nil {
		return nil, err
	}
	fields, err := newHook(v.Name, "validating", v.Rules, v.NamespaceSelector, v.MatchConditions)
	if err != nil {
		return nil, err
	}
	return &router{stamp: stamp, fields: fields}, nil
}

func newHook(name, kind string, rs []admissionregistrationv1.RuleWithOperations, sel *metav1.LabelSelector, conds []admissionregistrationv1.MatchCondition) (hook, error) {
	h := hook{rules: rs, selector: labels.Everything()}
	if sel != nil {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return hook{}, fmt.Errorf("webhook %s: namespaceSelector: %w", name, err)
		}
		h.selector = s
	}
	exprs := make([]plugincel.ExpressionAccessor, len(conds))
	for i := range conds {
		exprs[i] = &matchconditions.MatchCondition{Name: conds[i].Name, Expression: conds[i].Expression}
	}
	// As a webhook accessor compiles them (generic/webhook.go); with Fail, an
	// evaluation error is an error rather than a silent skip.
	fail := admissionregistrationv1.Fail
	h.matcher = matchconditions.NewMatcher(celCompiler.CompileCondition(exprs,
		plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true}, environment.StoredExpressions),
		&fail, "webhook", kind, name)
	return h, nil
}

var celCompiler = plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))

// calls reports whether the apiserver would send req to the webhook.
func (h *hook) calls(ctx context.Context, req *policy.Request, ns labels.Set) (bool, error) {
	var obj, old runtime.Object
	if len(req.Object) > 0 {
		u, err := unstructuredOf(req.Object)
		if err != nil {
			return false, fmt.Errorf("object: %w", err)
		}
		obj = u
	}
	if len(req.OldObject) > 0 {
		u, err := unstructuredOf(req.OldObject)
		if err != nil {
			return false, fmt.Errorf("oldObject: %w", err)
		}
		old = u
	}
	var opts runtime.Object
	switch req.Operation {
	case policy.Delete:
		do := &metav1.DeleteOptions{}
		if len(req.Options) > 0 {
			if err := json.Unmarshal(req.Options, do); err != nil {
				return false, fmt.Errorf("delete options: %w", err)
			}
		}
		opts = do
	case policy.Create:
		co := &metav1.CreateOptions{}
		_ = json.Unmarshal(req.Options, co) // {"fieldManager":...} that replay wrote, or nothing
		opts = co
	default:
		uo := &metav1.UpdateOptions{}
		_ = json.Unmarshal(req.Options, uo)
		opts = uo
	}
	gvr := schema.GroupVersionResource{Group: req.Group, Version: "v1", Resource: req.Resource}
	attrs := apiadmission.NewAttributesRecord(obj, old, schema.GroupVersionKind{Group: req.Group, Version: "v1"}, req.Namespace, req.Name,
		gvr, req.SubResource, apiadmission.Operation(req.Operation), opts, req.DryRun, &user.DefaultInfo{Name: req.User.Name, Groups: req.User.Groups})
	routed := false
	for _, r := range h.rules {
		if (&rules.Matcher{Rule: r, Attr: attrs}).Matches() {
			routed = true
			break
		}
	}
	if !routed {
		return false, nil
	}
	if req.Namespace != "" && !h.selector.Matches(ns) {
		return false, nil
	}
	va := &apiadmission.VersionedAttributes{Attributes: attrs, VersionedKind: attrs.GetKind(),
		VersionedObject: apiadmission.NewLazyObject(obj), VersionedOldObject: apiadmission.NewLazyObject(old)}
	res := h.matcher.Match(ctx, va, nil, nil)
	return res.Matches, res.Error
}

func unstructuredOf(b []byte) (*unstructured.Unstructured, error) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}
