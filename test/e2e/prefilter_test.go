package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/cmd/webhook/app"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// fieldsWebhook reads the validating webhook of the configuration name.
func fieldsWebhook(t *testing.T, c client.Client, name string) admissionregistrationv1.ValidatingWebhook {
	t.Helper()
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.Get(t.Context(), types.NamespacedName{Name: name}, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Webhooks[0]
}

func condition(w admissionregistrationv1.ValidatingWebhook, name string) string {
	for _, c := range w.MatchConditions {
		if c.Name == name {
			return c.Expression
		}
	}
	return ""
}

func TestPrefilter(t *testing.T) {
	env := startWebhookEnv(t)
	admin := env.Client
	alice := env.ClientAs(t, "alice")
	owner := env.ClientAs(t, "owner")
	ctx := t.Context()
	calls := func() (stamp, fields float64) {
		return counterValue(t, env.registry, "stampguard_admission_requests_total", "stamp"),
			counterValue(t, env.registry, "stampguard_admission_requests_total", "fields")
	}
	update := func(c client.Client, ns string, change func(*corev1.ConfigMap)) error {
		var cur corev1.ConfigMap
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cm"}, &cur); err != nil {
			t.Fatal(err)
		}
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		if cur.Data == nil {
			cur.Data = map[string]string{}
		}
		change(&cur)
		return c.Update(ctx, &cur)
	}
	for _, ns := range []string{"guarded", "second", "unguarded"} {
		namespace(t, admin, ns, nil)
		cm := configMap(ns, "cm", map[string]string{"team": "a"})
		cm.Data = map[string]string{"owned": "1", "free": "0"}
		create(t, admin, cm)
	}

	t.Run("with no policy the configurations route nothing", func(t *testing.T) {
		eventually(t, 10*time.Second, func() error {
			if rules := fieldsWebhook(t, admin, "stampguard").Rules; len(rules) != 0 {
				return fmt.Errorf("fields webhook still routes %+v", rules)
			}
			return nil
		})
		s0, f0 := calls()
		for i := range 3 {
			if err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Labels["team"] = fmt.Sprint(i) }); err != nil {
				t.Fatal(err)
			}
		}
		if s, f := calls(); s != s0 || f != f0 {
			t.Fatalf("the webhook was called without any policy: stamp %v -> %v, fields %v -> %v", s0, s, f0, f)
		}
		if err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Labels["team"] = "a" }); err != nil {
			t.Fatal(err)
		}
	})

	p := &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "prefiltered"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"guarded"}},
			RequireResourceVersion: true,
			FieldOwners:            []v1alpha1.FieldOwner{{Path: `data["owned"]`, Writers: v1alpha1.Writers{Users: []string{"owner"}}}},
			ImmutableFields:        []v1alpha1.ImmutableField{{Path: `metadata.labels["team"]`}},
		},
	}
	// The bound: a policy change reaches the configurations within 2 s.
	const reconcileBound = 2 * time.Second

	t.Run("a created policy reaches the configurations within 2s and is enforced", func(t *testing.T) {
		if err := admin.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		eventually(t, reconcileBound, func() error {
			w := fieldsWebhook(t, admin, "stampguard")
			if !strings.Contains(condition(w, webhookconfig.FieldsPolicyCondition), `data.?owned`) {
				return fmt.Errorf("condition %q does not guard data[\"owned\"]", condition(w, webhookconfig.FieldsPolicyCondition))
			}
			if !strings.Contains(w.NamespaceSelector.String(), "guarded") {
				return fmt.Errorf("namespaceSelector %v does not name the guarded namespace", w.NamespaceSelector)
			}
			return nil
		})
		// The apiserver's informer sees the new configuration a moment later.
		eventually(t, 10*time.Second, func() error {
			err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Data["owned"] = "alice" })
			if !apierrors.IsInvalid(err) {
				return fmt.Errorf("want 422 for a non-owner's change, got %w", err)
			}
			return nil
		})
	})

	t.Run("writes that touch no guarded field never reach the webhook", func(t *testing.T) {
		s0, f0 := calls()
		for i := range 5 {
			if err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Data["free"] = fmt.Sprint(i) }); err != nil {
				t.Fatal(err)
			}
			if err := update(alice, "unguarded", func(cm *corev1.ConfigMap) { cm.Data["owned"] = fmt.Sprint(i); cm.Labels["team"] = fmt.Sprint(i) }); err != nil {
				t.Fatal(err)
			}
			// A stampless write in a namespace no stamp policy covers.
			blind := configMap("unguarded", "cm", nil)
			if err := alice.Update(ctx, blind); err != nil {
				t.Fatal(err)
			}
		}
		if s, f := calls(); s != s0 || f != f0 {
			t.Fatalf("writes touching no guarded field reached the webhook: stamp %v -> %v, fields %v -> %v calls", s0, s, f0, f)
		}
		t.Run("while writes that could break a policy do", func(t *testing.T) {
			if err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Data["owned"] = "alice" }); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 for a non-owner's change, got %v", err)
			}
			if err := update(owner, "guarded", func(cm *corev1.ConfigMap) { cm.Data["owned"] = "owner" }); err != nil {
				t.Fatalf("the owner was refused: %v", err)
			}
			if err := update(alice, "guarded", func(cm *corev1.ConfigMap) { cm.Labels["team"] = "b" }); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 for a change of an immutable label, got %v", err)
			}
			if err := alice.Update(ctx, configMap("guarded", "cm", map[string]string{"team": "a"})); !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 for a stampless update, got %v", err)
			}
			// The owner's write breaks nothing either: the condition knows
			// the owner and skips the call.
			if s, f := calls(); s != s0+1 || f != f0+2 {
				t.Fatalf("want 1 stamp call and 2 fields calls, got stamp %v -> %v, fields %v -> %v", s0, s, f0, f)
			}
		})
	})

	t.Run("a changed policy reaches the configurations within 2s and is enforced", func(t *testing.T) {
		var cur v1alpha1.ConcurrencyPolicy
		if err := admin.Get(ctx, types.NamespacedName{Name: p.Name}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Match.Namespaces = []string{"guarded", "second"}
		if err := admin.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
		eventually(t, reconcileBound, func() error {
			if sel := fieldsWebhook(t, admin, "stampguard").NamespaceSelector.String(); !strings.Contains(sel, "second") {
				return fmt.Errorf("namespaceSelector %s does not name the second namespace", sel)
			}
			return nil
		})
		eventually(t, 10*time.Second, func() error {
			err := update(alice, "second", func(cm *corev1.ConfigMap) { cm.Labels["team"] = "b" })
			if !apierrors.IsInvalid(err) {
				return fmt.Errorf("want 422 in the second namespace, got %w", err)
			}
			return nil
		})
	})

	t.Run("the sync changes only the fields it owns and keeps the stamp it read", func(t *testing.T) {
		var cfg admissionregistrationv1.ValidatingWebhookConfiguration
		if err := admin.Get(ctx, types.NamespacedName{Name: "stampguard"}, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.Labels = map[string]string{"edited-by": "someone-else"}
		cfg.Webhooks[0].TimeoutSeconds = ptrTo[int32](7)
		if err := admin.Update(ctx, &cfg); err != nil {
			t.Fatal(err)
		}
		var cur v1alpha1.ConcurrencyPolicy
		if err := admin.Get(ctx, types.NamespacedName{Name: p.Name}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Match.Namespaces = []string{"guarded"}
		if err := admin.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
		eventually(t, reconcileBound, func() error {
			if err := admin.Get(ctx, types.NamespacedName{Name: "stampguard"}, &cfg); err != nil {
				return err
			}
			if strings.Contains(cfg.Webhooks[0].NamespaceSelector.String(), "second") {
				return fmt.Errorf("namespaceSelector %s still names the second namespace", cfg.Webhooks[0].NamespaceSelector)
			}
			return nil
		})
		if cfg.Labels["edited-by"] != "someone-else" || *cfg.Webhooks[0].TimeoutSeconds != 7 {
			t.Fatalf("the sync overwrote fields it does not own: labels %v, timeoutSeconds %d", cfg.Labels, *cfg.Webhooks[0].TimeoutSeconds)
		}
	})

	t.Run("two replicas keep the configurations in step with one update per change", func(t *testing.T) {
		reg2 := startReplica(t, env)
		syncs := func(reg *prometheus.Registry, result string) float64 {
			return counterWith(t, reg, "stampguard_configuration_syncs_total", map[string]string{"kind": "ValidatingWebhookConfiguration", "result": result})
		}
		updated0 := syncs(env.registry, "updated") + syncs(reg2, "updated")
		seen1, seen2 := syncs(env.registry, "updated")+syncs(env.registry, "unchanged"), syncs(reg2, "updated")+syncs(reg2, "unchanged")
		var cur v1alpha1.ConcurrencyPolicy
		if err := admin.Get(ctx, types.NamespacedName{Name: p.Name}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Match.Namespaces = []string{"guarded", "third"}
		if err := admin.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
		// Both replicas react to the change; wait until each has synced
		// since, then count the writes.
		eventually(t, 10*time.Second, func() error {
			a := syncs(env.registry, "updated") + syncs(env.registry, "unchanged")
			b := syncs(reg2, "updated") + syncs(reg2, "unchanged")
			if a == seen1 || b == seen2 {
				return fmt.Errorf("replica syncs since the change: %v and %v", a-seen1, b-seen2)
			}
			return nil
		})
		if sel := fieldsWebhook(t, admin, "stampguard").NamespaceSelector.String(); !strings.Contains(sel, "third") {
			t.Fatalf("namespaceSelector %s does not name the third namespace", sel)
		}
		if n := syncs(env.registry, "updated") + syncs(reg2, "updated") - updated0; n != 1 {
			t.Fatalf("the two replicas updated the configuration %v times for one change, want 1", n)
		}
	})

	t.Run("a deleted policy leaves the configurations routing nothing", func(t *testing.T) {
		if err := admin.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		eventually(t, reconcileBound, func() error {
			if rules := fieldsWebhook(t, admin, "stampguard").Rules; len(rules) != 0 {
				return fmt.Errorf("fields webhook still routes %+v", rules)
			}
			return nil
		})
	})

	t.Run("the apiserver accepts the conditions of a large policy set", func(t *testing.T) {
		for _, n := range []int{25, 400} {
			set := largePolicySet(t, n)
			co := webhookconfig.ConfigOptions{
				Name: fmt.Sprintf("large-%d", n), URL: env.WebhookURL(), CABundle: env.CAData, Policies: set,
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.stampguard.dev/large": "never"}},
			}
			mut, val := webhookconfig.Configurations(co)
			create(t, admin, mut)
			create(t, admin, val)
			expr := condition(val.Webhooks[0], webhookconfig.FieldsPolicyCondition)
			t.Logf("%d policies: fields condition of %d bytes", n, len(expr))
			if n == 25 && expr == "" {
				t.Fatalf("%d policies did not compile into a condition", n)
			}
			if n == 400 && expr != "" {
				t.Fatalf("%d policies compiled into %d bytes, past the bound it should fall back at", n, len(expr))
			}
		}
	})
}

func ptrTo[T any](v T) *T { return &v }

// largePolicySet builds n policies with a namespace, an excluded user and
// group, two field owners and two immutable fields (one a list select) each.
func largePolicySet(t *testing.T, n int) *policy.Set {
	t.Helper()
	var ps []*policy.Policy
	for i := range n {
		p, err := policy.Compile(&v1alpha1.ConcurrencyPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("large-%03d", i)},
			Spec: v1alpha1.ConcurrencyPolicySpec{
				Match: v1alpha1.Match{
					Resources:     []v1alpha1.ResourceMatch{{Resource: "configmaps"}, {Group: "apps", Resource: "deployments"}},
					Namespaces:    []string{fmt.Sprintf("team-%03d", i)},
					ExcludeUsers:  []string{"system:serviceaccount:kube-system:generic-garbage-collector"},
					ExcludeGroups: []string{"system:nodes"},
				},
				RequireDeletePreconditions: v1alpha1.DeletePreconditionUID,
				FieldOwners: []v1alpha1.FieldOwner{
					{Path: "spec.replicas", Writers: v1alpha1.Writers{ServiceAccounts: []string{"kube-system/horizontal-pod-autoscaler"}, Groups: []string{"autoscalers"}}},
					{Path: fmt.Sprintf(`data["owned-%d"]`, i), Writers: v1alpha1.Writers{Users: []string{"owner"}, FieldManagers: []string{"helm"}}},
				},
				ImmutableFields: []v1alpha1.ImmutableField{
					{Path: `metadata.labels["app.kubernetes.io/team"]`, Mode: v1alpha1.ImmutableOnceSet},
					{Path: "spec.template.spec.containers[name=app].image"},
				},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return policy.NewSet(ps...)
}

// startReplica runs a second webhook replica against env's control plane,
// keeping the same configurations in step, and returns its registry.
func startReplica(t *testing.T, env *webhookEnv) *prometheus.Registry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	configs := env.configs
	go func() {
		done <- app.Run(ctx, app.Options{
			Host: "127.0.0.1", Port: port, CertDir: env.CertDir,
			ProbeAddr: "0", RestConfig: env.Config, Namespace: "stampguard-system",
			Registry: reg, Logger: slog.New(slog.DiscardHandler),
			Ready:          func(string) { close(ready) },
			Configurations: &configs,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second replica stopped with: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("second replica failed to start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("second replica not ready after 60s")
	}
	return reg
}

// counterWith reads the counter name with exactly these label values.
func counterWith(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
