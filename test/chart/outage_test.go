package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/kubetest"
)

// TestOutage installs the chart's rendered objects with its default values
// into a real apiserver, with policies in two namespaces, and takes the
// webhook away: before its first start, while it runs, while no replica
// answers, and once it is back. While it is down, only the stampless
// updates that a policy guards are refused, with a message that names
// stampguard; Helm, kube-system, the webhook's own namespace, unguarded
// namespaces and unguarded kinds carry on. Then it starts again and
// enforces, and nothing else was restarted.
func TestOutage(t *testing.T) {
	env := startCluster(t)
	ctx := t.Context()
	port, probe := freePort(t), freePort(t)
	objs := objects(t, render(t, "", "auditSink.enabled=false",
		"webhook.port="+strconv.Itoa(port), "webhook.service.port="+strconv.Itoa(port),
		"webhook.probePort="+strconv.Itoa(probe), "webhook.tls.extraIPAddresses={127.0.0.1}"))
	createNamespace(t, env.Client, namespace)
	createRendered(t, env, objs)
	for _, ns := range []string{"app-a", "app-b", "other"} {
		createNamespace(t, env.Client, ns)
	}
	// app-a guards ConfigMaps and Secrets; app-b guards ConfigMaps and
	// Deployments, and names kube-system and the webhook's own namespace
	// too, which the configurations exclude whatever a policy says.
	policies := []*v1alpha1.ConcurrencyPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "app-a"}, Spec: v1alpha1.ConcurrencyPolicySpec{
			Action: v1alpha1.ActionDeny, RequireResourceVersion: true,
			Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}, {Resource: "secrets"}}, Namespaces: []string{"app-a"}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "app-b"}, Spec: v1alpha1.ConcurrencyPolicySpec{
			Action: v1alpha1.ActionDeny, RequireResourceVersion: true,
			Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}, {Group: "apps", Resource: "deployments"}},
				Namespaces: []string{"app-b", "kube-system", namespace}},
		}},
	}
	for _, p := range policies {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatalf("create policy %s: %v", p.Name, err)
		}
	}
	alice := env.ClientAs(t, "alice")
	for _, o := range []client.Object{
		configMap("app-a", "settings"), configMap("app-b", "settings"), configMap("other", "settings"), configMap("kube-system", "settings"),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app-b", Name: "token"}, StringData: map[string]string{"k": "v"}},
		deployment("app-b", "web", 1),
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s/%s: %v", o.GetNamespace(), o.GetName(), err)
		}
	}
	// A stampless PUT, as code that builds an object from scratch sends it.
	stampless := func(ns, name string) error {
		return alice.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"k": "blind"}})
	}

	t.Run("before the first replica is ready nothing is routed", func(t *testing.T) {
		if err := stampless("app-a", "settings"); err != nil {
			t.Fatalf("a stampless update went to a webhook that never ran: %v", err)
		}
		helmRelease(t, env, "app-a", "before", "1", "1")
	})

	stop := startWebhook(t, env, objs, probe)
	for _, p := range policies {
		waitReady(t, env.Client, p.Name) // Ready: compiled and routed
	}
	t.Run("while the webhook runs, stampless updates are denied", func(t *testing.T) {
		for _, ns := range []string{"app-a", "app-b"} {
			err := stampless(ns, "settings")
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `admission webhook "`+webhookconfig.StampWebhookName+`" denied the request`) {
				t.Fatalf("%s: want 422 from the stamp webhook, got %v", ns, err)
			}
		}
	})

	stop()
	t.Run("while no replica answers", func(t *testing.T) {
		t.Run("a guarded stampless update is refused with a message that names stampguard", func(t *testing.T) {
			for _, ns := range []string{"app-a", "app-b"} {
				err := stampless(ns, "settings")
				if err == nil || !strings.Contains(err.Error(), `failed calling webhook "`+webhookconfig.StampWebhookName+`"`) {
					t.Fatalf("%s: want the apiserver's refusal naming %s, got %v", ns, webhookconfig.StampWebhookName, err)
				}
			}
		})
		t.Run("a stampless update in a namespace no policy guards goes through", func(t *testing.T) {
			if err := stampless("other", "settings"); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("a stampless update of a kind its namespace's policy does not guard goes through", func(t *testing.T) {
			blind := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app-b", Name: "token"}, StringData: map[string]string{"k": "blind"}}
			if err := alice.Update(ctx, blind); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("kube-system goes through although a policy names it", func(t *testing.T) {
			if err := stampless("kube-system", "settings"); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("the webhook's own Deployment can be repaired although a policy names its namespace", func(t *testing.T) {
			var d = deployment(namespace, release+"-stampguard-webhook", 3)
			var live = deployment(namespace, "", 0)
			if err := env.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: d.Name}, live); err != nil {
				t.Fatal(err)
			}
			live.ResourceVersion = "" // stampless, the harshest case
			live.Spec.Replicas = d.Spec.Replicas
			if err := env.Client.Update(ctx, live); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("Helm installs and upgrades a release in a guarded namespace", func(t *testing.T) {
			helmRelease(t, env, "app-a", "during", "1", "1")
			helmRelease(t, env, "app-a", "during", "2", "2")
			helmRelease(t, env, "app-a", "before", "2", "2")
		})
		t.Run("a stamped update of a guarded kind goes through", func(t *testing.T) {
			var cm corev1.ConfigMap
			if err := alice.Get(ctx, types.NamespacedName{Namespace: "app-a", Name: "settings"}, &cm); err != nil {
				t.Fatal(err)
			}
			cm.Data = map[string]string{"k": "careful"}
			if err := alice.Update(ctx, &cm); err != nil {
				t.Fatal(err)
			}
		})
	})

	startWebhook(t, env, objs, probe)
	t.Run("once a replica answers again, enforcement resumes", func(t *testing.T) {
		eventually(t, 30*time.Second, func() error {
			err := stampless("app-a", "settings")
			if apierrors.IsInvalid(err) && strings.Contains(err.Error(), `admission webhook "`+webhookconfig.StampWebhookName+`" denied the request`) {
				return nil
			}
			return fmt.Errorf("want 422 from the stamp webhook, got %w", err)
		})
	})
}

func configMap(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"k": "v"}}
}

// helmRelease installs (or upgrades) a one-ConfigMap chart as release name
// in ns with bin/helm, and checks that Helm recorded it as deployed at
// revision.
func helmRelease(t *testing.T, env *kubetest.Env, ns, name, value, revision string) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"Chart.yaml":               "apiVersion: v2\nname: demo\nversion: 0.1.0\n",
		"templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-demo\ndata:\n  value: {{ .Values.value | quote }}\n",
	}
	for p, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kc := kubeconfig(t, env.Config)
	if _, err := helm(t, kc, "upgrade", "--install", name, dir, "--namespace", ns, "--set", "value="+value, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, kc, "list", "--namespace", ns, "--all", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var releases []struct {
		Name, Status string
		Revision     json.Number
	}
	if err := json.Unmarshal([]byte(out), &releases); err != nil {
		t.Fatalf("helm list: %v\n%s", err, out)
	}
	for _, r := range releases {
		if r.Name == name {
			if r.Status != "deployed" || r.Revision.String() != revision {
				t.Fatalf("release %s in %s: status %s revision %s, want deployed at revision %s\n%s", name, ns, r.Status, r.Revision, revision, out)
			}
			return
		}
	}
	t.Fatalf("no release %s in %s: %s", name, ns, out)
}

// TestUpgradeKeepsTheSyncedRouting: the chart renders no rules,
// namespaceSelector or matchConditions while the webhook owns them, so
// helm upgrade (a three-way merge) leaves what the webhook wrote there.
func TestUpgradeKeepsTheSyncedRouting(t *testing.T) {
	env := startCluster(t)
	ctx := t.Context()
	kc := kubeconfig(t, env.Config)
	probe := freePort(t)
	args := []string{"--namespace", namespace, "--set", "auditSink.enabled=false", "--set", "webhook.probePort=" + strconv.Itoa(probe),
		"--set", "webhook.port=" + strconv.Itoa(freePort(t))}
	if _, err := helm(t, kc, append([]string{"install", release, chartDir(t), "--create-namespace"}, args...)...); err != nil {
		t.Fatal(err)
	}
	manifest, err := helm(t, kc, "get", "manifest", release, "--namespace", namespace)
	if err != nil {
		t.Fatal(err)
	}
	startWebhook(t, env, objects(t, manifest), probe)
	createNamespace(t, env.Client, "app-a")
	p := &v1alpha1.ConcurrencyPolicy{ObjectMeta: metav1.ObjectMeta{Name: "app-a"}, Spec: v1alpha1.ConcurrencyPolicySpec{
		Action: v1alpha1.ActionDeny, RequireResourceVersion: true,
		Match: v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"app-a"}},
	}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitReady(t, env.Client, p.Name)
	stampCondition := func() string {
		var m admissionregistrationv1.MutatingWebhookConfiguration
		getObj(t, env.Client, "", release+"-stampguard", &m)
		for _, c := range m.Webhooks[0].MatchConditions {
			if c.Name == webhookconfig.StampPolicyCondition {
				return c.Expression
			}
		}
		return ""
	}
	before := stampCondition()
	if before == "" || before == "false" {
		t.Fatalf("the webhook did not narrow the configurations to its policy: condition %q", before)
	}
	var was admissionregistrationv1.MutatingWebhookConfiguration
	getObj(t, env.Client, "", release+"-stampguard", &was)
	if _, err := helm(t, kc, append([]string{"upgrade", release, chartDir(t), "--set", "webhook.timeoutSeconds=3"}, args...)...); err != nil {
		t.Fatal(err)
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	getObj(t, env.Client, "", release+"-stampguard", &m)
	if *m.Webhooks[0].TimeoutSeconds != 3 {
		t.Fatalf("the upgrade did not apply: timeout %d", *m.Webhooks[0].TimeoutSeconds)
	}
	w, v := was.Webhooks[0], m.Webhooks[0]
	if !equality.Semantic.DeepEqual(w.Rules, v.Rules) || !equality.Semantic.DeepEqual(w.NamespaceSelector, v.NamespaceSelector) ||
		!equality.Semantic.DeepEqual(w.MatchConditions, v.MatchConditions) {
		t.Fatalf("helm upgrade changed what the webhook synced:\n%s", lineDiff(toYAML(t, w), toYAML(t, v)))
	}
}
