package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// BenchmarkUpdateLatency measures what the webhook adds to an UPDATE through
// a real apiserver on loopback. Three namespaces get the same stamped
// ConfigMap update in turn: one unguarded, one guarded by the webhook and one
// by an equivalent ValidatingAdmissionPolicy, so machine noise hits all three
// alike. The updates are server-side dry runs: admission runs in full, the
// etcd write (whose fsync jitter would drown a sub-millisecond difference)
// does not. Reported: p50 and p99 per variant and what each guard adds to
// the unguarded update's p50 and p99, in microseconds.
func BenchmarkUpdateLatency(b *testing.B) {
	env := startWebhookEnv(b)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ctx := b.Context()
	variants := []string{"bench-none", "bench-webhook", "bench-vap"}
	for _, ns := range variants {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"bench": ns}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"bench-webhook"}},
			FieldOwners:            []v1alpha1.FieldOwner{{Path: `data["owned"]`, Writers: v1alpha1.Writers{Users: []string{"owner"}}}},
			ImmutableFields:        []v1alpha1.ImmutableField{{Path: `metadata.labels["team"]`}},
			RequireResourceVersion: true,
		},
	}); err != nil {
		b.Fatal(err)
	}
	fail := admissionregistrationv1.Fail
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{
				{Expression: `object.?data[?'owned'] == oldObject.?data[?'owned'] || request.userInfo.username == 'owner'`},
				{Expression: `object.metadata.?labels[?'team'] == oldObject.metadata.?labels[?'team']`},
			},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, vap, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        "bench",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources:    &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": "bench-vap"}}},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	cms := make([]*corev1.ConfigMap, len(variants))
	for i, ns := range variants {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cm", Labels: map[string]string{"team": "a"}},
			Data:       map[string]string{"owned": "1", "free": "0"},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		cms[i] = cm
	}
	// Prove that each guard is in force before timing anything.
	waitGuarded := func(ns string, i int) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			bad := cms[i].DeepCopy()
			bad.Labels["team"] = "b"
			_, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, bad, metav1.UpdateOptions{DryRun: []string{"All"}})
			if err != nil {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: the guard never refused a change of the immutable label", ns)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitGuarded("bench-webhook", 1)
	waitGuarded("bench-vap", 2)

	lat := make([][]time.Duration, len(variants))
	n := 0
	for b.Loop() {
		for i, ns := range variants {
			cms[i].Data["free"] = fmt.Sprint(n)
			start := time.Now()
			_, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cms[i], metav1.UpdateOptions{DryRun: []string{"All"}})
			lat[i] = append(lat[i], time.Since(start))
			if err != nil {
				b.Fatalf("%s: %v", ns, err)
			}
		}
		n++
	}
	for i, name := range []string{"none", "webhook", "vap"} {
		p50, p99 := percentile(lat[i], 0.50), percentile(lat[i], 0.99)
		b.ReportMetric(float64(p50.Microseconds()), name+"-p50-us")
		b.ReportMetric(float64(p99.Microseconds()), name+"-p99-us")
		if i == 0 {
			continue
		}
		b.ReportMetric(float64((p50 - percentile(lat[0], 0.50)).Microseconds()), name+"-added-p50-us")
		b.ReportMetric(float64((p99 - percentile(lat[0], 0.99)).Microseconds()), name+"-added-p99-us")
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
