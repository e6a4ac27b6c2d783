package webhookconfig

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/policy/admission/admissiontest"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/test/kubetest"
)

// racingWriter makes one concurrent edit of the object just before the
// sync's first update, as another replica or a person would.
type racingWriter struct {
	client.Client
	raced bool
}

func (w *racingWriter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if !w.raced {
		w.raced = true
		other := obj.DeepCopyObject().(client.Object)
		if err := w.Get(ctx, client.ObjectKeyFromObject(obj), other); err != nil {
			return err
		}
		other.SetLabels(map[string]string{"edited-by": "someone-else"})
		if err := w.Client.Update(ctx, other); err != nil {
			return err
		}
	}
	return w.Client.Update(ctx, obj, opts...)
}

func TestConfigSync(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	ctx := t.Context()
	opts := ConfigOptions{Name: "stampguard", URL: "https://127.0.0.1:9", Resources: []GuardedResource{{Resource: "configmaps"}}}
	// Configurations made before any policy was narrowed in: every write routed.
	all := opts
	all.RouteAll = true
	mut, val := Configurations(all)
	for _, obj := range []client.Object{mut, val} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "labels"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:           v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"team-a"}},
			ImmutableFields: []v1alpha1.ImmutableField{{Path: `metadata.labels["team"]`}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	m := NewSyncMetrics(prometheus.NewRegistry())
	w := &racingWriter{Client: env.Client}
	sync := NewSyncer(env.Client, w, opts, m, slog.New(slog.DiscardHandler))
	count := func(kind, result string) float64 { return testutil.ToFloat64(m.syncs.WithLabelValues(kind, result)) }
	get := func() *admissionregistrationv1.ValidatingWebhookConfiguration {
		var cur admissionregistrationv1.ValidatingWebhookConfiguration
		if err := env.Client.Get(ctx, client.ObjectKey{Name: opts.Name}, &cur); err != nil {
			t.Fatal(err)
		}
		return &cur
	}

	t.Run("a concurrent edit makes the update conflict; the sync reads again and keeps the edit", func(t *testing.T) {
		if err := sync.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := count("MutatingWebhookConfiguration", "conflict"); got != 1 {
			t.Fatalf("want exactly one conflict, on the first update, got %v", got)
		}
		var raced admissionregistrationv1.MutatingWebhookConfiguration
		if err := env.Client.Get(ctx, client.ObjectKey{Name: opts.Name}, &raced); err != nil {
			t.Fatal(err)
		}
		if raced.Labels["edited-by"] != "someone-else" {
			t.Fatalf("the concurrent edit was overwritten: labels %v", raced.Labels)
		}
		if c := admissiontest.ConditionNames(raced.Webhooks[0].MatchConditions); len(c) != 4 || c[1] != StampPolicyCondition {
			t.Fatalf("the retried update did not land: conditions %v", c)
		}
		cur := get()
		if !strings.Contains(condition(cur.Webhooks[0], FieldsPolicyCondition), "team") {
			t.Fatalf("the fields webhook's condition does not guard the label: %+v", cur.Webhooks[0].MatchConditions)
		}
		if got := count("ValidatingWebhookConfiguration", "updated"); got != 1 {
			t.Fatalf("validating configuration updated %v times, want 1", got)
		}
	})

	t.Run("a sync with nothing to change writes nothing", func(t *testing.T) {
		before := get().ResourceVersion
		if err := sync.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if after := get().ResourceVersion; after != before {
			t.Fatalf("resourceVersion %s -> %s for a sync that changed nothing", before, after)
		}
		if got := count("ValidatingWebhookConfiguration", "unchanged"); got != 1 {
			t.Fatalf("want one unchanged sync, got %v", got)
		}
	})

	t.Run("a missing configuration is an error naming it", func(t *testing.T) {
		other := NewSyncer(env.Client, env.Client, ConfigOptions{Name: "absent"}, m, slog.New(slog.DiscardHandler))
		err := other.Sync(ctx)
		if err == nil || !strings.Contains(err.Error(), `"absent"`) {
			t.Fatalf("want an error naming the configuration, got %v", err)
		}
	})
}

func condition(w admissionregistrationv1.ValidatingWebhook, name string) string {
	for _, c := range w.MatchConditions {
		if c.Name == name {
			return c.Expression
		}
	}
	return ""
}
