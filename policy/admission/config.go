package admission

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy"
)

// Names and paths of the two webhooks. The apiserver prefixes audit
// annotation keys with the webhook name, so the audit sink looks for these.
const (
	StampWebhookName  = "stamp.stampguard.dev"
	FieldsWebhookName = "fields.stampguard.dev"
	StampPath         = "/stamp"
	FieldsPath        = "/fields"
)

// StamplessCondition lets the apiserver skip the mutating call for every
// update that carries a resourceVersion, which is nearly all of them.
const StamplessCondition = `!has(object.metadata.resourceVersion) || object.metadata.resourceVersion == ''`

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

// ConfigOptions describe how the apiserver reaches the webhook.
type ConfigOptions struct {
	// Name of both configuration objects. Defaults to "stampguard".
	Name string
	// URL is the base URL of the webhook (tests, out-of-cluster); paths are
	// appended. Set either URL or Service.
	URL string
	// Service is the in-cluster Service in front of the webhook.
	Service *admissionregistrationv1.ServiceReference
	// CABundle verifies the webhook's serving certificate.
	CABundle []byte
	// FailurePolicy when the webhook cannot be reached. Defaults to Fail.
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// TimeoutSeconds for each call. Defaults to 5.
	TimeoutSeconds int32
	// Resources to guard. Defaults to DefaultGuardedResources.
	Resources []GuardedResource
	// NamespaceSelector narrows the namespaces sent to the webhook.
	NamespaceSelector *metav1.LabelSelector
	// BreakGlassGroup members are never sent to the webhook. Defaults to
	// "stampguard:break-glass"; "-" disables the exemption.
	BreakGlassGroup string
	// Policies, when set, narrow both webhooks to what these policies need
	// (the pre-filter): their rules to the guarded resources and
	// operations, their namespaceSelector to the guarded namespaces, and a
	// CEL match condition that is true for every write that could break a
	// policy. Nil (the default) keeps the configurations unnarrowed.
	Policies *policy.Set
	// ProtectedNamespaces are skipped by policies that name no namespace
	// (the webhook adds its own); used with Policies. Defaults to
	// policy.DefaultProtectedNamespaces.
	ProtectedNamespaces []string
}

func (o *ConfigOptions) setDefaults() {
	if o.Name == "" {
		o.Name = "stampguard"
	}
	if o.FailurePolicy == "" {
		o.FailurePolicy = admissionregistrationv1.Fail
	}
	if o.TimeoutSeconds == 0 {
		o.TimeoutSeconds = 5
	}
	if len(o.Resources) == 0 {
		o.Resources = DefaultGuardedResources
	}
	if o.BreakGlassGroup == "" {
		o.BreakGlassGroup = DefaultBreakGlassGroup
	}
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
	fail := o.FailurePolicy
	timeout := o.TimeoutSeconds

	var conditions []admissionregistrationv1.MatchCondition
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
			ClientConfig:            o.clientConfig(StampPath),
			Rules:                   o.rules(true, admissionregistrationv1.Update),
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       o.NamespaceSelector,
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
			ClientConfig:            o.clientConfig(FieldsPath),
			Rules:                   o.rules(true, admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete),
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       o.NamespaceSelector,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions:         conditions,
		}},
	}
	if o.Policies != nil {
		o.narrow(mutating, validating)
	}
	return mutating, validating
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

// rules lists one rule per API group. With scale, workloads whose replicas
// the HPA and kubectl scale write through the scale subresource get it too:
// in both phases, since a Scale carries its parent's resourceVersion and a
// stampless Scale PUT overwrites replicas unconditionally.
func (o *ConfigOptions) rules(scale bool, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	byGroup := map[string][]string{}
	var groups []string
	for _, r := range o.Resources {
		if _, seen := byGroup[r.Group]; !seen {
			groups = append(groups, r.Group)
		}
		byGroup[r.Group] = append(byGroup[r.Group], r.Resource)
		if scale && r.Group == "apps" && (r.Resource == "deployments" || r.Resource == "statefulsets" || r.Resource == "replicasets") {
			byGroup[r.Group] = append(byGroup[r.Group], r.Resource+"/scale")
		}
	}
	scope := admissionregistrationv1.AllScopes
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(groups))
	for _, g := range groups {
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{g}, APIVersions: []string{"*"}, Resources: byGroup[g], Scope: &scope,
			},
		})
	}
	return out
}
