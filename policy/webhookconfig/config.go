package webhookconfig

//go:generate go run ./chartgen -out ../../charts/stampguard/templates/webhook/_configurations.tpl

import (
	"fmt"
	"io"
	"maps"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/api/annotation"
)

// Names of the two webhooks. The apiserver prefixes audit annotation keys
// with the webhook name (package annotation defines both for the audit
// sink).
const (
	StampWebhookName  = annotation.StampWebhook
	FieldsWebhookName = annotation.FieldsWebhook
)

// StamplessCondition lets the apiserver skip the mutating call for every
// update that carries a resourceVersion, which is nearly all of them: the
// stamp rule's matchCondition (policy.StamplessCondition).
const StamplessCondition = policy.StamplessCondition

// HelmReleaseCondition keeps Helm's release records away from both
// webhooks. Helm stores each release in a Secret of type helm.sh/release.v1
// (a ConfigMap with the configmap driver), labelled owner=helm, and updates
// it without a resourceVersion: guarded, every Helm operation in a guarded
// namespace would fail while no replica answers, and leave the release
// pending. A delete carries only oldObject, hence both.
const HelmReleaseCondition = `!(request.resource.group == '' && (request.resource.resource == 'secrets' || request.resource.resource == 'configmaps') && ` +
	`((object != null && ((has(object.type) && object.type == 'helm.sh/release.v1') || (has(object.metadata.labels) && 'owner' in object.metadata.labels && object.metadata.labels['owner'] == 'helm'))) || ` +
	`(oldObject != null && ((has(oldObject.type) && oldObject.type == 'helm.sh/release.v1') || (has(oldObject.metadata.labels) && 'owner' in oldObject.metadata.labels && oldObject.metadata.labels['owner'] == 'helm')))))`

// ExemptLabel on a namespace, with the value "true", keeps every write in
// it away from both webhooks, whatever the policies say.
const ExemptLabel = annotation.Domain + "/exempt"

// GuardedResource is a resource the webhook configurations send to the
// webhook. Policies can only act on resources listed here.
type GuardedResource struct {
	Group    string
	Resource string
}

// DefaultGuardedResources are the built-in kinds that accept stampless
// updates (custom resources already refuse them) and that controllers and
// people commonly fight over.
var DefaultGuardedResources = []GuardedResource{
	{"", "configmaps"}, {"", "secrets"}, {"", "services"},
	{"apps", "deployments"}, {"apps", "statefulsets"}, {"apps", "replicasets"}, {"apps", "daemonsets"},
}

// Defaults of ConfigOptions, the chart's defaults too.
const (
	DefaultConfigName          = "stampguard"
	DefaultTimeoutSeconds      = 2
	DefaultStampFailurePolicy  = admissionregistrationv1.Fail
	DefaultFieldsFailurePolicy = admissionregistrationv1.Ignore
)

// ConfigOptions describe how the apiserver reaches the webhook and what it
// sends there. The chart's webhook configurations are generated from the
// same code (chartgen/, `make generate`), so its values mean what these fields
// mean.
type ConfigOptions struct {
	// Name of both configuration objects. Defaults to DefaultConfigName.
	Name string
	// URL is the base URL of the webhook (tests, out-of-cluster); paths are
	// appended. Set either URL or Service.
	URL string
	// Service is the in-cluster Service in front of the webhook.
	Service *admissionregistrationv1.ServiceReference
	// CABundle verifies the webhook's serving certificate.
	CABundle []byte
	// StampFailurePolicy is what the apiserver does with a routed stampless
	// update while no replica answers. Defaults to Fail
	// (DefaultStampFailurePolicy): only stampless updates that a policy
	// guards reach the stamp check.
	StampFailurePolicy admissionregistrationv1.FailurePolicyType
	// FieldsFailurePolicy is the same for the field owner, immutable field
	// and delete precondition webhook. Defaults to Ignore
	// (DefaultFieldsFailurePolicy): every guarded
	// create, update and delete reaches it, and Fail would stop rollouts
	// and controllers while no replica answers.
	FieldsFailurePolicy admissionregistrationv1.FailurePolicyType
	// TimeoutSeconds for each call. Defaults to DefaultTimeoutSeconds.
	TimeoutSeconds int32
	// Resources to guard. Defaults to DefaultGuardedResources.
	Resources []GuardedResource
	// NamespaceSelector narrows the namespaces sent to the webhook further.
	NamespaceSelector *metav1.LabelSelector
	// ExcludedNamespaces are never sent to the webhook, whatever the
	// policies say. Nil defaults to policy.DefaultProtectedNamespaces and the
	// Service's namespace (the webhook's own, so that it can always be
	// repaired); an empty, non-nil list excludes none. Namespaces labelled
	// ExemptLabel=true are excluded too, always.
	ExcludedNamespaces []string
	// BreakGlassGroup members are never sent to the webhook. Defaults to
	// DefaultBreakGlassGroup; "-" disables the exemption.
	BreakGlassGroup string
	// RouteAll sends every write of Resources (in the namespaces not
	// excluded) to the webhooks, whatever the policies. Off by default:
	// the configurations route only what Policies guard.
	RouteAll bool
	// Policies narrow both webhooks to what these policies need (the
	// pre-filter): their rules to the guarded resources and operations,
	// their namespaceSelector to the guarded namespaces, and a CEL match
	// condition that is true for every write that could break a policy.
	// Nil (or empty) is no policy: nothing is routed, and the webhooks
	// carry no rules, namespaceSelector or matchConditions at all (the
	// webhook's --sync-configurations fills them in from the live
	// policies).
	Policies *policy.Set
	// ProtectedNamespaces are skipped by policies that name no namespace
	// (the webhook adds its own); used with Policies. Defaults to
	// policy.DefaultProtectedNamespaces.
	ProtectedNamespaces []string
}

func (o *ConfigOptions) setDefaults() {
	if o.Name == "" {
		o.Name = DefaultConfigName
	}
	if o.StampFailurePolicy == "" {
		o.StampFailurePolicy = DefaultStampFailurePolicy
	}
	if o.FieldsFailurePolicy == "" {
		o.FieldsFailurePolicy = DefaultFieldsFailurePolicy
	}
	if o.TimeoutSeconds == 0 {
		o.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if len(o.Resources) == 0 {
		o.Resources = DefaultGuardedResources
	}
	if o.ExcludedNamespaces == nil {
		o.ExcludedNamespaces = slices.Clone(policy.DefaultProtectedNamespaces)
		if o.Service != nil && o.Service.Namespace != "" {
			o.ExcludedNamespaces = append(o.ExcludedNamespaces, o.Service.Namespace)
		}
	}
	o.ExcludedNamespaces = uniq(o.ExcludedNamespaces)
	if o.BreakGlassGroup == "" {
		o.BreakGlassGroup = DefaultBreakGlassGroup
	}
	if o.Policies == nil {
		o.Policies = policy.NewSet()
	}
}

// uniq drops repeated names, keeping the first of each (as the chart's uniq).
func uniq(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// DefaultBreakGlassGroup bypasses every policy, for emergencies.
const DefaultBreakGlassGroup = "stampguard:break-glass"

// Configurations builds the MutatingWebhookConfiguration (stamp check) and the
// ValidatingWebhookConfiguration (field owners, immutable fields, delete
// preconditions) that route guarded writes to the webhook.
func Configurations(o ConfigOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	o.setDefaults()
	none := admissionregistrationv1.SideEffectClassNone
	equivalent := admissionregistrationv1.Equivalent
	never := admissionregistrationv1.NeverReinvocationPolicy
	stampFail, fieldsFail := o.StampFailurePolicy, o.FieldsFailurePolicy
	timeout := o.TimeoutSeconds

	conditions := []admissionregistrationv1.MatchCondition{{Name: "not-helm-release", Expression: HelmReleaseCondition}}
	if o.BreakGlassGroup != "-" {
		conditions = append(conditions, admissionregistrationv1.MatchCondition{
			Name:       "not-break-glass",
			Expression: `!('` + o.BreakGlassGroup + `' in request.userInfo.groups)`,
		})
	}

	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    StampWebhookName,
			ClientConfig:            o.clientConfig(admission.StampPath),
			Rules:                   o.rules(admissionregistrationv1.Update),
			FailurePolicy:           &stampFail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       o.baseSelector(),
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      &never,
			MatchConditions: append([]admissionregistrationv1.MatchCondition{{
				Name: "stampless-update", Expression: StamplessCondition,
			}}, conditions...),
		}},
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    FieldsWebhookName,
			ClientConfig:            o.clientConfig(admission.FieldsPath),
			Rules:                   o.rules(admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete),
			FailurePolicy:           &fieldsFail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       o.baseSelector(),
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions:         slices.Clone(conditions),
		}},
	}
	switch {
	case o.RouteAll:
	case o.Policies.Len() == 0:
		// Nothing to route: no rules, and no selector or conditions
		// either, so that re-applying these objects (helm upgrade,
		// kubectl apply, both three-way merges) leaves what the sync
		// wrote there alone.
		mutating.Webhooks[0].Rules, mutating.Webhooks[0].NamespaceSelector, mutating.Webhooks[0].MatchConditions = nil, nil, nil
		validating.Webhooks[0].Rules, validating.Webhooks[0].NamespaceSelector, validating.Webhooks[0].MatchConditions = nil, nil, nil
	default:
		o.narrow(mutating, validating)
	}
	return mutating, validating
}

// WriteConfigurations writes exactly what Configurations(o) builds as a
// YAML stream of two documents, the MutatingWebhookConfiguration and then
// the ValidatingWebhookConfiguration, ready for `kubectl apply -f -`.
func WriteConfigurations(w io.Writer, o ConfigOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	mut, val := Configurations(o)
	for i, obj := range []any{mut, val} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encode webhook configuration: %w", err)
		}
		if i > 0 {
			b = append([]byte("---\n"), b...)
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("write webhook configurations: %w", err)
		}
	}
	return nil
}

// baseSelector is what every webhook's namespaceSelector starts from: not
// an excluded namespace, not an exempt one, and the configured selector.
func (o *ConfigOptions) baseSelector() *metav1.LabelSelector {
	sel := &metav1.LabelSelector{}
	if len(o.ExcludedNamespaces) > 0 {
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: slices.Clone(o.ExcludedNamespaces),
		})
	}
	sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{
		Key: ExemptLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"},
	})
	if o.NamespaceSelector != nil {
		sel.MatchLabels = maps.Clone(o.NamespaceSelector.MatchLabels)
		for _, r := range o.NamespaceSelector.MatchExpressions {
			sel.MatchExpressions = append(sel.MatchExpressions, *r.DeepCopy())
		}
	}
	return sel
}

func (o *ConfigOptions) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: o.CABundle}
	if o.Service != nil {
		svc := *o.Service
		svc.Path = &path
		cc.Service = &svc
	} else {
		u := o.URL + path
		cc.URL = &u
	}
	return cc
}

// rules lists one rule per resource; the workloads whose replicas the HPA
// and kubectl scale write through the scale subresource get it in the same
// rule: in both phases, since a Scale carries its parent's resourceVersion
// and a stampless Scale PUT overwrites replicas unconditionally.
func (o *ConfigOptions) rules(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	scope := admissionregistrationv1.AllScopes
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(o.Resources))
	for _, r := range o.Resources {
		resources := []string{r.Resource}
		if policy.IsScalableWorkload(r.Group, r.Resource) {
			resources = append(resources, r.Resource+"/scale")
		}
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{r.Group}, APIVersions: []string{"*"}, Resources: resources, Scope: &scope,
			},
		})
	}
	return out
}
