package chart

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// TestManagedConfigurationsSyncFromTheRenderedOptions: with
// webhook.manageConfigurations (the default) the webhook keeps the
// configurations in step with the policies (--sync-configurations). It
// owns their rules, namespaceSelector and matchConditions, which the chart
// leaves out (nothing is routed before a sync), so the options it gets
// must be the chart's: the flags, parsed as the webhook parses them, build
// what the chart renders for the same values with every write routed
// (manageConfigurations=false), and what it renders with the sync on.
// And its ClusterRole may update those two objects.
func TestManagedConfigurationsSyncFromTheRenderedOptions(t *testing.T) {
	values := []string{"webhook.excludedNamespaces={kube-system,ops}",
		"webhook.namespaceSelector.matchLabels.team=shop",
		"webhook.namespaceSelector.matchExpressions[0].key=env",
		"webhook.namespaceSelector.matchExpressions[0].operator=NotIn",
		"webhook.namespaceSelector.matchExpressions[0].values[0]=dev"}
	objs := objects(t, render(t, "defaults", values...))
	routed := objects(t, render(t, "defaults", append(values, "webhook.manageConfigurations=false")...))
	name := release + "-stampguard"
	var dep appsv1.Deployment
	find(t, objs, "Deployment", name+"-webhook", &dep)
	flags := map[string]string{}
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--sync-") {
			flags[k] = v
		}
	}
	if flags["--sync-configurations"] != name {
		t.Fatalf("--sync-configurations=%q, want %q (args %v)", flags["--sync-configurations"], name, dep.Spec.Template.Spec.Containers[0].Args)
	}
	o := webhookconfig.ConfigOptions{Name: name, URL: "https://unused"}
	var err error
	if o.Resources, err = webhookconfig.ParseGuardedResources(flags["--sync-resources"]); err != nil {
		t.Fatalf("--sync-resources: %v", err)
	}
	if o.NamespaceSelector, err = metav1.ParseToLabelSelector(flags["--sync-namespace-selector"]); err != nil {
		t.Fatalf("--sync-namespace-selector: %v", err)
	}
	if o.ExcludedNamespaces, err = webhookconfig.ParseNamespaces(flags["--sync-excluded-namespaces"]); err != nil {
		t.Fatalf("--sync-excluded-namespaces: %v", err)
	}
	var synced, all admissionregistrationv1.MutatingWebhookConfiguration
	find(t, objs, "MutatingWebhookConfiguration", name, &synced)
	if w := synced.Webhooks[0]; len(w.Rules)+len(w.MatchConditions) != 0 || w.NamespaceSelector != nil {
		t.Errorf("the managed configuration sets what the sync owns: %+v", w)
	}
	if m, _ := webhookconfig.Configurations(o); !equality.Semantic.DeepEqual(m.Webhooks[0].Rules, synced.Webhooks[0].Rules) {
		t.Errorf("the sync's empty set does not build the rendered rules")
	}
	find(t, routed, "MutatingWebhookConfiguration", name, &all)
	o.RouteAll = true
	wantM, wantV := webhookconfig.Configurations(o)
	var gotM admissionregistrationv1.MutatingWebhookConfiguration
	var gotV admissionregistrationv1.ValidatingWebhookConfiguration
	find(t, routed, "MutatingWebhookConfiguration", name, &gotM)
	find(t, routed, "ValidatingWebhookConfiguration", name, &gotV)
	sameSelector := func(a, b *metav1.LabelSelector) bool {
		sa, errA := metav1.LabelSelectorAsSelector(a)
		sb, errB := metav1.LabelSelectorAsSelector(b)
		return errA == nil && errB == nil && sa.String() == sb.String()
	}
	if !equality.Semantic.DeepEqual(gotM.Webhooks[0].Rules, wantM.Webhooks[0].Rules) || !sameSelector(gotM.Webhooks[0].NamespaceSelector, wantM.Webhooks[0].NamespaceSelector) ||
		!equality.Semantic.DeepEqual(gotM.Webhooks[0].MatchConditions, wantM.Webhooks[0].MatchConditions) {
		t.Errorf("mutating: rendered rules %+v selector %v; from the sync's flags %+v %v",
			gotM.Webhooks[0].Rules, gotM.Webhooks[0].NamespaceSelector, wantM.Webhooks[0].Rules, wantM.Webhooks[0].NamespaceSelector)
	}
	if !equality.Semantic.DeepEqual(gotV.Webhooks[0].Rules, wantV.Webhooks[0].Rules) || !sameSelector(gotV.Webhooks[0].NamespaceSelector, wantV.Webhooks[0].NamespaceSelector) ||
		!equality.Semantic.DeepEqual(gotV.Webhooks[0].MatchConditions, wantV.Webhooks[0].MatchConditions) {
		t.Errorf("validating: rendered rules %+v selector %v; from the sync's flags %+v %v",
			gotV.Webhooks[0].Rules, gotV.Webhooks[0].NamespaceSelector, wantV.Webhooks[0].Rules, wantV.Webhooks[0].NamespaceSelector)
	}
	var role rbacv1.ClusterRole
	find(t, objs, "ClusterRole", name+"-webhook", &role)
	allowed := false
	for _, r := range role.Rules {
		if len(r.ResourceNames) == 1 && r.ResourceNames[0] == name &&
			strings.Contains(strings.Join(r.Resources, ","), "validatingwebhookconfigurations") &&
			strings.Contains(strings.Join(r.Verbs, ","), "update") {
			allowed = true
		}
	}
	if !allowed {
		t.Errorf("the webhook's ClusterRole may not update its configurations: %+v", role.Rules)
	}
}

// TestUnmanagedConfigurationsAreLeftAlone: with manageConfigurations=false
// the webhook is told not to sync (its default would sync "stampguard"),
// and its ClusterRole may not touch the configurations.
func TestUnmanagedConfigurationsAreLeftAlone(t *testing.T) {
	objs := objects(t, render(t, "defaults", "webhook.manageConfigurations=false"))
	name := release + "-stampguard"
	var dep appsv1.Deployment
	find(t, objs, "Deployment", name+"-webhook", &dep)
	args := dep.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--sync-configurations=") {
		t.Errorf("args %v: want --sync-configurations= (no sync)", args)
	}
	var role rbacv1.ClusterRole
	find(t, objs, "ClusterRole", name+"-webhook", &role)
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, "admissionregistration.k8s.io") {
			t.Errorf("the ClusterRole may touch webhook configurations: %+v", r)
		}
	}
}
