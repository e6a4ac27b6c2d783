package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/cmd/webhook/app"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/kubetest"
)

// webhookEnv is one control plane with the webhook running in cluster mode.
type webhookEnv struct {
	*kubetest.Env
	registry *prometheus.Registry
	// configs are the options of the configurations the webhook keeps in step.
	configs webhookconfig.ConfigOptions
}

func startWebhookEnv(t testing.TB) *webhookEnv {
	t.Helper()
	return startWebhookEnvAudited(t, kubetest.DefaultAuditPolicy)
}

// startWebhookEnvAudited is startWebhookEnv with the apiserver's audit
// log written at auditPolicy.
func startWebhookEnvAudited(t testing.TB, auditPolicy string) *webhookEnv {
	t.Helper()
	env := kubetest.Start(t, kubetest.Options{AuditPolicy: auditPolicy, AuditLog: true})
	// The configurations exist before the webhook starts; the webhook then
	// keeps them in step with the policies (the pre-filter).
	configs := webhookconfig.ConfigOptions{
		URL: env.WebhookURL(), CABundle: env.CAData,
		Resources: []webhookconfig.GuardedResource{{Group: "", Resource: "configmaps"}, {Group: "apps", Resource: "deployments"}},
		// The namespaces of the webhook-down test get configurations of their own.
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "e2e.stampguard.dev/down", Operator: metav1.LabelSelectorOpDoesNotExist,
		}}},
	}
	mut, val := webhookconfig.Configurations(configs)
	create(t, env.Client, mut)
	create(t, env.Client, val)
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- app.Run(ctx, app.Options{
			Host: env.WebhookHost, Port: env.WebhookPort, CertDir: env.CertDir,
			ProbeAddr: "0", RestConfig: env.Config, Namespace: "stampguard-system",
			Registry: reg, Logger: slog.New(slog.DiscardHandler),
			Ready:          func(string) { close(ready) },
			Configurations: &configs,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook stopped with: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the cleanup, which waits for Run to end
		t.Fatalf("webhook failed to start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("webhook not ready after 60s")
	}
	return &webhookEnv{Env: env, registry: reg, configs: configs}
}

func create(t testing.TB, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(t.Context(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func namespace(t *testing.T, c client.Client, name string, labels map[string]string) {
	t.Helper()
	create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
}

// applyPolicy creates or replaces a policy and waits until the webhook
// reports it in force (or refused).
func applyPolicy(t *testing.T, c client.Client, p *v1alpha1.ConcurrencyPolicy, wantReady metav1.ConditionStatus) *v1alpha1.ConcurrencyPolicy {
	t.Helper()
	ctx := t.Context()
	var cur v1alpha1.ConcurrencyPolicy
	err := c.Get(ctx, types.NamespacedName{Name: p.Name}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create policy %s: %v", p.Name, err)
		}
	case err != nil:
		t.Fatalf("get policy %s: %v", p.Name, err)
	default:
		cur.Spec = p.Spec
		if err := c.Update(ctx, &cur); err != nil {
			t.Fatalf("update policy %s: %v", p.Name, err)
		}
	}
	var got v1alpha1.ConcurrencyPolicy
	eventually(t, 20*time.Second, func() error {
		if err := c.Get(ctx, types.NamespacedName{Name: p.Name}, &got); err != nil {
			return err
		}
		cond := apimeta.FindStatusCondition(got.Status.Conditions, app.ConditionReady)
		if cond == nil || cond.ObservedGeneration != got.Generation || cond.Status != wantReady {
			return fmt.Errorf("policy %s: condition %+v at generation %d, want Ready=%s", p.Name, cond, got.Generation, wantReady)
		}
		return nil
	})
	return &got
}

func eventually(t *testing.T, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func statusOf(t *testing.T, err error) metav1.Status {
	t.Helper()
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		t.Fatalf("want an API status error, got %v", err)
	}
	return st.Status()
}

func configMap(ns, name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Data: map[string]string{"k": "v"}}
}

// warnings collects the Warning headers a client receives.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.seen...)
}

func deployment(ns, name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
			},
		},
	}
}

func counterValue(t testing.TB, reg *prometheus.Registry, name, endpoint string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == endpoint {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// auditLogHas reports whether one line of the audit log contains every want.
func auditLogHas(path string, want ...string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
lines:
	for sc.Scan() {
		for _, w := range want {
			if !strings.Contains(sc.Text(), w) {
				continue lines
			}
		}
		return nil
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("no audit log line contains all of %q", want)
}

var _ rest.WarningHandler = (*warnings)(nil)
