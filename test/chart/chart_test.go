package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/test/bintest"
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
		{"leases among the guarded resources", []string{dsn, "webhook.guardedResources[0].group=coordination.k8s.io", "webhook.guardedResources[0].resource=leases"}, "at '/webhook/guardedResources/0/resource'"},
		{"an image digest that is no sha256 digest", []string{dsn, "webhook.image.digest=latest"}, "at '/webhook/image/digest'"},
		{"the webhook's own namespace guarded with the field rules failing closed", []string{dsn, "webhook.excludeReleaseNamespace=false", "webhook.failurePolicy.fields=Fail"}, "nothing could update the webhook's own Deployment"},
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

// TestOldKubernetesIsRefused: the configurations' matchConditions need
// Kubernetes 1.30; validate.yaml refuses older clusters.
func TestOldKubernetesIsRefused(t *testing.T) {
	_, err := helm(t, os.DevNull, "template", release, chartDir(t), "--namespace", namespace, "--kube-version", "v1.29.9",
		"--set", "auditSink.enabled=false")
	if err == nil || !strings.Contains(err.Error(), "stampguard needs 1.30 or later") {
		t.Fatalf("want the kubeVersion refusal, got %v", err)
	}
}

// TestNotesWarn: unsafe but legal settings are named in NOTES (a dry run
// against the apiserver: helm install --dry-run=client assumes Kubernetes
// 1.20, which Chart.yaml refuses).
func TestNotesWarn(t *testing.T) {
	env := startCluster(t)
	kc := kubeconfig(t, env.Config)
	for _, tc := range []struct {
		name string
		sets []string
		want string
	}{
		{"one replica with Fail", []string{"webhook.replicas=1"}, "WARNING: webhook.replicas=1 with failurePolicy Fail"},
		{"every write routed", []string{"webhook.manageConfigurations=false"}, "WARNING: webhook.manageConfigurations=false"},
		{"the defaults name the exclusions", nil, "Never sent to the webhook: namespaces kube-system, kube-node-lease, " + namespace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"install", release, chartDir(t), "--namespace", namespace, "--dry-run=server", "--set", "auditSink.enabled=false"}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			out, err := helm(t, kc, args...)
			if err != nil {
				t.Fatal(err)
			}
			notes := out[strings.Index(out, "NOTES:"):]
			if !strings.Contains(notes, tc.want) {
				t.Fatalf("NOTES lack %q:\n%s", tc.want, notes)
			}
		})
	}
	out, err := helm(t, kc, "install", release, chartDir(t), "--namespace", namespace, "--dry-run=server", "--set", "auditSink.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "WARNING") {
		t.Errorf("the defaults warn:\n%s", out)
	}
}

// generated matches the certificate material, the token and the field
// history key the chart generates, which differ at every render.
var generated = regexp.MustCompile(`(?m)^(\s*(?:caBundle|ca\.crt|tls\.crt|tls\.key|token|key): )[A-Za-z0-9+/=]{20,}$`)

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

// configCases pair chart values with the `webhook configurations` flags
// that stand for them. Every value set of ci/ that renders the webhook is
// here; flags left out take the command's defaults, so the chart's
// defaults are checked against the binary's.
var configCases = []configCase{
	{name: "defaults", set: "defaults"},
	{name: "cert-manager", set: "cert-manager", certManager: true},
	{name: "existing-secrets", set: "existing-secrets", certManager: true},
	{name: "minimal", set: "minimal", flags: []string{
		"--route-all", "--resources", "configmaps,apps/deployments", "--timeout-seconds", "5",
		"--stamp-failure-policy", "Ignore", "--fields-failure-policy", "Ignore", "--break-glass-group", "-",
		"--excluded-namespaces", "kube-system," + namespace, "--namespace-selector", "stampguard.dev/guarded=true",
	}},
	{name: "no excluded namespace, a selector of both kinds", set: "defaults", sets: []string{
		"webhook.excludedNamespaces=null", "webhook.excludeReleaseNamespace=false", "webhook.failurePolicy.stamp=Ignore",
		"webhook.namespaceSelector.matchLabels.team=shop",
		"webhook.namespaceSelector.matchExpressions[0].key=env",
		"webhook.namespaceSelector.matchExpressions[0].operator=NotIn",
		"webhook.namespaceSelector.matchExpressions[0].values[0]=dev",
	}, flags: []string{"--excluded-namespaces", "", "--stamp-failure-policy", "Ignore", "--namespace-selector", "team=shop,env notin (dev)"}},
	{name: "every write routed, another break-glass group", set: "defaults", sets: []string{
		"webhook.manageConfigurations=false", "webhook.breakGlassGroup=ops:emergency", "webhook.timeoutSeconds=9",
	}, flags: []string{"--route-all", "--break-glass-group", "ops:emergency", "--timeout-seconds", "9"}},
}

type configCase struct {
	name        string
	set         string   // ci/ value set
	sets        []string // --set on top
	flags       []string // besides --name, --service and --ca-bundle
	certManager bool     // caBundle comes from cert-manager's cainjector
}

// TestWebhookConfigurationsMatchTheCommand renders the chart and runs the
// built `webhook configurations` with the equivalent flags: both must
// print the same objects (but for the chart's labels and annotations).
// The chart's template is generated from the same Go code (make
// generate); this proves the generation and the values' mapping.
func TestWebhookConfigurationsMatchTheCommand(t *testing.T) {
	webhook := bintest.Build(t, "./cmd/webhook")
	for _, set := range valueSets {
		if !slices.ContainsFunc(configCases, func(c configCase) bool { return c.set == set }) && len(kinds(objects(t, render(t, set)), "MutatingWebhookConfiguration")) > 0 {
			t.Errorf("value set %s renders webhook configurations: add it to configCases", set)
		}
	}
	for _, c := range configCases {
		t.Run(c.name, func(t *testing.T) {
			objs := objects(t, render(t, c.set, c.sets...))
			name := release + "-stampguard"
			var gotM admissionregistrationv1.MutatingWebhookConfiguration
			var gotV admissionregistrationv1.ValidatingWebhookConfiguration
			find(t, objs, "MutatingWebhookConfiguration", name, &gotM)
			find(t, objs, "ValidatingWebhookConfiguration", name, &gotV)

			args := append([]string{"configurations", "--name", name, "--service", namespace + "/" + name + "-webhook:443"}, c.flags...)
			if c.certManager {
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
				if len(secret.Data["ca.crt"]) == 0 {
					t.Fatalf("the webhook's TLS Secret has no ca.crt")
				}
				ca := filepath.Join(t.TempDir(), "ca.crt")
				if err := os.WriteFile(ca, secret.Data["ca.crt"], 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--ca-bundle", ca)
			}
			out := run(t, webhook, args, nil)
			cmdObjs := objects(t, out)
			var wantM admissionregistrationv1.MutatingWebhookConfiguration
			var wantV admissionregistrationv1.ValidatingWebhookConfiguration
			find(t, cmdObjs, "MutatingWebhookConfiguration", name, &wantM)
			find(t, cmdObjs, "ValidatingWebhookConfiguration", name, &wantV)

			// Labels and annotations are the chart's; everything else must match.
			gotM.ObjectMeta = metav1.ObjectMeta{Name: gotM.Name}
			gotV.ObjectMeta = metav1.ObjectMeta{Name: gotV.Name}
			if !equality.Semantic.DeepEqual(&wantM, &gotM) {
				t.Errorf("the chart's MutatingWebhookConfiguration differs from webhook %s (make generate rewrites the chart's template; check configurations.yaml's mapping of the values):\n%s",
					strings.Join(args, " "), lineDiff(toYAML(t, &wantM), toYAML(t, &gotM)))
			}
			if !equality.Semantic.DeepEqual(&wantV, &gotV) {
				t.Errorf("the chart's ValidatingWebhookConfiguration differs from webhook %s:\n%s",
					strings.Join(args, " "), lineDiff(toYAML(t, &wantV), toYAML(t, &gotV)))
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

// TestChartKnobs: the values that adapt the pods to a platform reach them.
func TestChartKnobs(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	objs := objects(t, render(t, "defaults",
		"webhook.image.digest="+digest, "webhook.hostNetwork=true",
		"webhook.podSecurityContext.runAsUser=null", "webhook.podSecurityContext.runAsGroup=null", "webhook.podSecurityContext.fsGroup=null",
		"webhook.extraEnv[0].name=GOMAXPROCS", "webhook.extraEnv[0].value=2",
		"webhook.extraVolumes[0].name=extra", "webhook.extraVolumes[0].emptyDir.medium=Memory",
		"webhook.extraVolumeMounts[0].name=extra", "webhook.extraVolumeMounts[0].mountPath=/extra",
		"webhook.networkPolicy.apiserverPeers[0].ipBlock.cidr=10.0.0.0/24",
		"auditSink.extraEnv[0].name=TZ", "auditSink.extraEnv[0].value=UTC"))
	var d appsv1.Deployment
	find(t, objs, "Deployment", release+"-stampguard-webhook", &d)
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if c.Image != "ghcr.io/stampguard/webhook@"+digest {
		t.Errorf("image %s, want the digest", c.Image)
	}
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %s", spec.HostNetwork, spec.DNSPolicy)
	}
	if sc := spec.SecurityContext; sc.RunAsUser != nil || sc.FSGroup != nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod security context %+v: want no fixed IDs and runAsNonRoot kept", sc)
	}
	if spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMAXPROCS" && e.Value == "2" }) ||
		!slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAMESPACE" }) {
		t.Errorf("env %+v", c.Env)
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "extra" && v.EmptyDir != nil }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "extra" && m.MountPath == "/extra" }) {
		t.Errorf("volumes %+v mounts %+v", spec.Volumes, c.VolumeMounts)
	}
	var np networkingv1.NetworkPolicy
	find(t, objs, "NetworkPolicy", release+"-stampguard-webhook", &np)
	if len(np.Spec.Ingress) != 2 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9443 ||
		len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].IPBlock.CIDR != "10.0.0.0/24" ||
		np.Spec.Ingress[1].Ports[0].Port.IntValue() != 8081 || len(np.Spec.Ingress[1].From) != 0 {
		t.Errorf("network policy %+v", np.Spec)
	}
	var sts appsv1.StatefulSet
	find(t, objs, "StatefulSet", release+"-stampguard-auditsink", &sts)
	if env := sts.Spec.Template.Spec.Containers[0].Env; len(env) != 2 || env[0].Name != "POD_IP" || env[1].Name != "TZ" {
		t.Errorf("sink env %+v", env)
	}
	if len(kinds(objects(t, render(t, "defaults", "webhook.networkPolicy.enabled=false")), "NetworkPolicy")) != 0 {
		t.Errorf("networkPolicy.enabled=false still renders one")
	}
}
