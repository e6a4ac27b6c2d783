package e2e

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// BenchmarkUpdateLatency measures what each guard adds to an UPDATE through
// a real apiserver on loopback. Each guard has a namespace of its own and
// the same stamped ConfigMap update goes to every namespace in turn (the
// order rotates each round), so machine noise hits all variants alike:
//
//   - none: bench-none, which no configuration sends to the webhook (the
//     request counter proves it: see below);
//   - prefilter-free: bench-prefilter, guarded by a ConcurrencyPolicy through
//     the compiled configurations; the write changes no guarded field;
//   - prefilter-owner: the same namespace; the owner of data["owned"]
//     changes it (allowed, and the condition knows the owner);
//   - plain: bench-plain, the same policy through configurations without
//     the pre-filter (the webhook is called and allows the write);
//   - vap: bench-vap, the same checks as a ValidatingAdmissionPolicy.
//
// The updates are server-side dry runs: admission runs in full, the etcd
// write (whose fsync jitter would drown a sub-millisecond difference) does
// not. Reported per variant: p50, p90 and p99 and what it adds to none's,
// in microseconds, and the webhook calls per round.
func BenchmarkUpdateLatency(b *testing.B) {
	env := startWebhookEnv(b)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	// Every timed write impersonates a user, as the owner's must: the
	// impersonation checks then cost every variant the same.
	alice := kubernetes.NewForConfigOrDie(env.As("alice"))
	owner := kubernetes.NewForConfigOrDie(env.As("owner"))
	ctx := b.Context()
	namespaces := []string{"bench-none", "bench-prefilter", "bench-plain", "bench-vap"}
	for _, ns := range namespaces {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"bench": ns}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"bench-prefilter", "bench-plain"}},
			FieldOwners:            []v1alpha1.FieldOwner{{Path: `data["owned"]`, Writers: v1alpha1.Writers{Users: []string{"owner"}}}},
			ImmutableFields:        []v1alpha1.ImmutableField{{Path: `metadata.labels["team"]`}},
			RequireResourceVersion: true,
		},
	}); err != nil {
		b.Fatal(err)
	}
	// stampguard without the pre-filter, for bench-plain only. The
	// compiled configurations route bench-plain too, but their condition
	// skips its writes: none of them changes a guarded field.
	mut, val := webhookconfig.Configurations(webhookconfig.ConfigOptions{
		Name: "bench-plain", URL: env.WebhookURL(), CABundle: env.CAData, RouteAll: true,
		Resources:         []webhookconfig.GuardedResource{{Resource: "configmaps"}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": "bench-plain"}},
	})
	if err := env.Client.Create(ctx, mut); err != nil {
		b.Fatal(err)
	}
	if err := env.Client.Create(ctx, val); err != nil {
		b.Fatal(err)
	}
	createBenchVAP(b, cs, "bench-vap")
	cms := map[string]*corev1.ConfigMap{}
	for _, ns := range namespaces {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cm", Labels: map[string]string{"team": "a"}},
			Data:       map[string]string{"owned": "1", "free": "0"},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		cms[ns] = cm
	}
	calls := func() float64 {
		return counterValue(b, env.registry, "stampguard_admission_requests_total", "stamp") +
			counterValue(b, env.registry, "stampguard_admission_requests_total", "fields")
	}
	dryRun := metav1.UpdateOptions{DryRun: []string{"All"}}
	within := func(what string, fn func() error) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := fn()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Prove that each guard is in force before timing anything.
	for _, ns := range []string{"bench-prefilter", "bench-plain", "bench-vap"} {
		within(ns+": the guard never refused a change of the immutable label", func() error {
			bad := cms[ns].DeepCopy()
			bad.Labels["team"] = "b"
			if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, bad, dryRun); err == nil {
				return errors.New("allowed")
			}
			return nil
		})
	}
	// And that the pre-filter is: a free write in bench-prefilter, and any
	// write in bench-none, reach the webhook no more.
	within("writes touching no guarded field still reach the webhook", func() error {
		before := calls()
		for _, ns := range []string{"bench-none", "bench-prefilter"} {
			for range 20 {
				if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cms[ns], dryRun); err != nil {
					b.Fatal(err)
				}
			}
		}
		if after := calls(); after != before {
			return fmt.Errorf("%v calls", after-before)
		}
		return nil
	})

	type variant struct {
		name string
		ns   string
		cs   *kubernetes.Clientset
		edit func(cm *corev1.ConfigMap, n int)
	}
	free := func(cm *corev1.ConfigMap, n int) { cm.Data["free"] = fmt.Sprint(n) }
	variants := []variant{
		{"none", "bench-none", alice, free},
		{"prefilter-free", "bench-prefilter", alice, free},
		{"prefilter-owner", "bench-prefilter", owner, func(cm *corev1.ConfigMap, n int) { cm.Data["owned"] = fmt.Sprint(n) }},
		{"plain", "bench-plain", alice, free},
		{"vap", "bench-vap", alice, free},
	}
	lat := make([][]time.Duration, len(variants))
	before := calls()
	n := 0
	for b.Loop() {
		for k := range variants {
			i := (k + n) % len(variants)
			v := variants[i]
			cm := cms[v.ns].DeepCopy()
			v.edit(cm, n)
			start := time.Now()
			_, err := v.cs.CoreV1().ConfigMaps(v.ns).Update(ctx, cm, dryRun)
			lat[i] = append(lat[i], time.Since(start))
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
		n++
	}
	// Only plain's validating call reaches the webhook: exactly one call
	// per round proves that none, prefilter-free and prefilter-owner never did.
	got := calls() - before
	if got != float64(n) {
		b.Fatalf("the webhook was called %v times in %d rounds, want exactly one per round (plain's)", got, n)
	}
	b.ReportMetric(got/float64(n), "webhook-calls/round")
	none := lat[0]
	for i, v := range variants {
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}} {
			p := percentile(lat[i], q.q)
			b.ReportMetric(float64(p.Microseconds()), v.name+"-"+q.name+"-us")
			if i > 0 {
				b.ReportMetric(float64((p - percentile(none, q.q)).Microseconds()), v.name+"-added-"+q.name+"-us")
			}
		}
	}
	// The webhook's own view: the upper bound of the histogram bucket that
	// holds its 99th percentile, from read to answer written.
	b.ReportMetric(histogramP99(b, env.registry, "stampguard_admission_evaluation_seconds", "fields")*1e6, "handler-p99-bucket-us")
	b.ReportMetric(0, "ns/op")
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func histogramP99(b *testing.B, reg *prometheus.Registry, name, endpoint string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != endpoint {
				continue
			}
			h := m.GetHistogram()
			for _, bucket := range h.GetBucket() {
				if float64(bucket.GetCumulativeCount()) >= 0.99*float64(h.GetSampleCount()) {
					return bucket.GetUpperBound()
				}
			}
		}
	}
	return 0
}
