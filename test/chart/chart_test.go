package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy/admission"
)

func TestLintStrict(t *testing.T) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			if out, err := helm(t, os.DevNull, "lint", "--strict", chartDir(t), "-f", valuesFile(t, set)); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestBadValuesAreRefused shows that values.schema.json and the chart's
// checks refuse wrong values with a message that names the value.
func TestBadValuesAreRefused(t *testing.T) {
	dsn := "auditSink.clickhouse.dsn=clickhouse://h:9000"
	for _, tc := range []struct {
		name string
		sets []string
		want string
	}{
		{"a misspelled value", []string{dsn, "webhook.replica=3"}, "additional properties 'replica' not allowed"},
		{"an unknown failure policy", []string{dsn, "webhook.failurePolicy.stamp=fail"}, "at '/webhook/failurePolicy/stamp': value must be one of 'Fail', 'Ignore'"},
		{"a timeout above the apiserver's 30 s", []string{dsn, "webhook.timeoutSeconds=31"}, "at '/webhook/timeoutSeconds'"},
		{"a retention that is not whole hours or days", []string{dsn, "auditSink.retention=30 days"}, "at '/auditSink/retention'"},
		{"a spool size without a unit the sink reads", []string{dsn, "auditSink.spoolMax=1G B"}, "at '/auditSink/spoolMax'"},
		{"an invalid cluster name", []string{dsn, "auditSink.cluster=-prod"}, "at '/auditSink/cluster'"},
		{"no ClickHouse DSN", nil, "auditSink.clickhouse.dsn or auditSink.clickhouse.existingSecret is required"},
		{"a client CA without its Secret", []string{dsn, "auditSink.auth.clientCA.enabled=true"}, "auditSink.auth.clientCA.enabled needs auditSink.auth.clientCA.existingSecret"},
		{"a webhook client CA without its Secret", []string{dsn, "webhook.clientCA.enabled=true"}, "webhook.clientCA.enabled needs webhook.clientCA.existingSecret"},
		{"a token shorter than 32 characters", []string{dsn, "auditSink.auth.token.value=short"}, "at '/auditSink/auth/token/value'"},
		{"a client CA without allowed names", []string{dsn, "auditSink.auth.clientCA.enabled=true", "auditSink.auth.clientCA.existingSecret=ca", "auditSink.auth.clientCA.allowedNames={}"}, "allowedNames"},
		{"no sink authentication at all", []string{dsn, "auditSink.auth.token.enabled=false"}, "no authentication configured"},
		{"a grace period within the sink's shutdown timeout", []string{dsn, "auditSink.terminationGracePeriodSeconds=20"}, "auditSink.terminationGracePeriodSeconds (20) must exceed auditSink.shutdownTimeoutSeconds (20)"},
		{"a webhook grace period within its shutdown timeout", []string{dsn, "webhook.shutdownTimeoutSeconds=40"}, "webhook.terminationGracePeriodSeconds (30) must exceed webhook.shutdownTimeoutSeconds (40)"},
		{"a node port on a ClusterIP Service", []string{dsn, "auditSink.service.nodePort=30443"}, "auditSink.service.nodePort needs auditSink.service.type NodePort"},
		{"a break-glass group that would break the CEL string", []string{dsn, "webhook.breakGlassGroup=a'b"}, "at '/webhook/breakGlassGroup'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", release, chartDir(t), "--namespace", namespace}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			_, err := helm(t, os.DevNull, args...)
			if err == nil {
				t.Fatal("the chart rendered")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error lacks %q:\n%v", tc.want, err)
			}
		})
	}
}

// generated matches the certificate material and the token the chart
// generates, which differ at every render.
var generated = regexp.MustCompile(`(?m)^(\s*(?:caBundle|ca\.crt|tls\.crt|tls\.key|token): )[A-Za-z0-9+/=]{20,}$`)

// TestGolden compares each value set's render with testdata. The dashboard
// ConfigMaps are left out: they are dashboards/generated's files, which
// their own generator owns (TestDashboards* check them).
func TestGolden(t *testing.T) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			var docs []string
			for _, doc := range strings.Split(render(t, set), "\n---\n") {
				if !strings.Contains(doc, "# Source: stampguard/templates/dashboards.yaml") {
					docs = append(docs, doc)
				}
			}
			got := generated.ReplaceAllString(strings.Join(docs, "\n---\n"), "${1}GENERATED")
			path := filepath.Join("testdata", set+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./test/chart -run TestGolden -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("helm template with ci/%s-values.yaml differs from %s (rerun with -update and review the diff):\n%s", set, path, lineDiff(string(want), got))
			}
		})
	}
}

// configOptions are the admission.ConfigOptions that each value set stands
// for. Fields left zero take admission.Configurations' defaults, so the
// chart's defaults are checked against the Go code's.
var configOptions = map[string]struct {
	opts                 admission.ConfigOptions
	stampFail, fieldFail admissionregistrationv1.FailurePolicyType
	certManager          bool // caBundle comes from cert-manager's cainjector
}{
	"defaults": {
		opts: admission.ConfigOptions{
			TimeoutSeconds:    2,
			NamespaceSelector: notIn("kube-system", "kube-node-lease", namespace),
		},
		stampFail: admissionregistrationv1.Fail, fieldFail: admissionregistrationv1.Ignore,
	},
	"cert-manager": {
		opts: admission.ConfigOptions{
			TimeoutSeconds:    2,
			NamespaceSelector: notIn("kube-system", "kube-node-lease", namespace),
		},
		stampFail: admissionregistrationv1.Fail, fieldFail: admissionregistrationv1.Ignore,
		certManager: true,
	},
	"existing-secrets": {
		opts: admission.ConfigOptions{
			TimeoutSeconds:    2,
			NamespaceSelector: notIn("kube-system", "kube-node-lease", namespace),
		},
		stampFail: admissionregistrationv1.Fail, fieldFail: admissionregistrationv1.Ignore,
		certManager: true,
	},
	"minimal": {
		opts: admission.ConfigOptions{
			TimeoutSeconds: 5,
			Resources:      []admission.GuardedResource{{Group: "", Resource: "configmaps"}, {Group: "apps", Resource: "deployments"}},
			NamespaceSelector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"stampguard.dev/guarded": "true"},
				MatchExpressions: notIn("kube-system", namespace).MatchExpressions,
			},
			BreakGlassGroup: "-",
		},
		stampFail: admissionregistrationv1.Ignore, fieldFail: admissionregistrationv1.Ignore,
	},
}

func notIn(namespaces ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: namespaces,
	}}}
}

// TestWebhookConfigurationsMatchGo decodes the rendered webhook
// configurations of every value set and compares them field by field with
// what admission.Configurations builds from the equivalent options: the
// chart cannot drift from the Go code.
func TestWebhookConfigurationsMatchGo(t *testing.T) {
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			objs := objects(t, render(t, set))
			want, ok := configOptions[set]
			if len(kinds(objs, "MutatingWebhookConfiguration")) == 0 {
				if ok {
					t.Fatalf("no webhook configurations rendered")
				}
				return
			}
			if !ok {
				t.Fatalf("value set %s renders webhook configurations: add its options to configOptions", set)
			}
			name := release + "-stampguard"
			var gotM admissionregistrationv1.MutatingWebhookConfiguration
			var gotV admissionregistrationv1.ValidatingWebhookConfiguration
			find(t, objs, "MutatingWebhookConfiguration", name, &gotM)
			find(t, objs, "ValidatingWebhookConfiguration", name, &gotV)

			o := want.opts
			o.Name = name
			o.Service = &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: name + "-webhook", Port: ptr.To[int32](443)}
			if want.certManager {
				// cert-manager's cainjector fills caBundle from the Certificate.
				inject := namespace + "/" + name + "-webhook"
				for _, a := range []map[string]string{gotM.Annotations, gotV.Annotations} {
					if a["cert-manager.io/inject-ca-from"] != inject {
						t.Errorf("annotations %v: want cert-manager.io/inject-ca-from %s", a, inject)
					}
				}
			} else {
				var secret corev1.Secret
				find(t, objs, "Secret", name+"-webhook-tls", &secret)
				o.CABundle = secret.Data["ca.crt"]
				if len(o.CABundle) == 0 {
					t.Fatalf("the webhook's TLS Secret has no ca.crt")
				}
			}
			o.FailurePolicy = want.stampFail
			wantM, _ := admission.Configurations(o)
			o.FailurePolicy = want.fieldFail
			_, wantV := admission.Configurations(o)

			// Labels and annotations are the chart's; everything else must match.
			gotM.ObjectMeta = metav1.ObjectMeta{Name: gotM.Name}
			gotV.ObjectMeta = metav1.ObjectMeta{Name: gotV.Name}
			if !equality.Semantic.DeepEqual(wantM, &gotM) {
				t.Errorf("MutatingWebhookConfiguration differs from admission.Configurations (change charts/stampguard/templates/webhook/configurations.yaml with policy/admission/config.go):\n%s", lineDiff(toYAML(t, wantM), toYAML(t, &gotM)))
			}
			if !equality.Semantic.DeepEqual(wantV, &gotV) {
				t.Errorf("ValidatingWebhookConfiguration differs from admission.Configurations (change charts/stampguard/templates/webhook/configurations.yaml with policy/admission/config.go):\n%s", lineDiff(toYAML(t, wantV), toYAML(t, &gotV)))
			}
		})
	}
}

// TestGeneratedCertificatesServeTheService checks the generated material:
// the serving certificate is signed by the CA in caBundle and names the
// Service as the apiserver calls it.
func TestGeneratedCertificatesServeTheService(t *testing.T) {
	objs := objects(t, render(t, "defaults"))
	for _, svc := range []string{release + "-stampguard-webhook", release + "-stampguard-auditsink"} {
		var secret corev1.Secret
		find(t, objs, "Secret", svc+"-tls", &secret)
		verifyServing(t, secret.Data["ca.crt"], secret.Data["tls.crt"], secret.Data["tls.key"], svc+"."+namespace+".svc")
	}
}

func toYAML(t testing.TB, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineDiff lists the lines only in want (-) and only in got (+), in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Longest common subsequence; the files are small.
	lcs := make([][]int, len(w)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(g)+1)
	}
	for i := len(w) - 1; i >= 0; i-- {
		for j := len(g) - 1; j >= 0; j-- {
			if w[i] == g[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var b strings.Builder
	i, j := 0, 0
	for i < len(w) || j < len(g) {
		switch {
		case i < len(w) && j < len(g) && w[i] == g[j]:
			i, j = i+1, j+1
		case j < len(g) && (i == len(w) || lcs[i][j+1] >= lcs[i+1][j]):
			b.WriteString("+ " + g[j] + "\n")
			j++
		default:
			b.WriteString("- " + w[i] + "\n")
			i++
		}
	}
	return b.String()
}
