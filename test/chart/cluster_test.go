package chart

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
)

// The foreign CRDs some value sets need, read from the modules that publish
// them (fetched from the Go module proxy at test time, never copied here).
var foreignCRDs = []struct {
	module string
	files  []string
}{
	{"github.com/cert-manager/cert-manager@v1.21.2", []string{
		"deploy/crds/cert-manager.io_certificates.yaml",
		"deploy/crds/cert-manager.io_issuers.yaml",
		"deploy/crds/cert-manager.io_clusterissuers.yaml",
	}},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", []string{
		"example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
	}},
}

// crdPaths are the chart's CRDs first, then cert-manager's and the
// Prometheus operator's.
func crdPaths(t testing.TB) []string {
	t.Helper()
	paths := []string{filepath.Join(chartDir(t), "crds")}
	for _, m := range foreignCRDs {
		cmd := exec.Command("go", "mod", "download", "-json", m.module)
		cmd.Dir = t.TempDir() // outside the module: go.mod stays untouched
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.Output()
		var info struct{ Dir, Error string }
		_ = json.Unmarshal(out, &info)
		if err != nil || info.Dir == "" {
			t.Fatalf("go mod download %s (for its CRDs): %v %s", m.module, err, info.Error)
		}
		for _, f := range m.files {
			paths = append(paths, filepath.Join(info.Dir, f))
		}
	}
	return paths
}

func startCluster(t testing.TB) *kubetest.Env {
	t.Helper()
	testenv.SkipIfShort(t, "starts a real kube-apiserver")
	return kubetest.Start(t, kubetest.Options{CRDDirs: crdPaths(t)})
}

func createNamespace(t testing.TB, c client.Client, name string) {
	t.Helper()
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// TestServerSideDryRun sends every object of every value set to the real
// kube-apiserver as a dry-run create: schemas, CRDs (the chart's,
// cert-manager's, the Prometheus operator's) and validation all apply.
func TestServerSideDryRun(t *testing.T) {
	env := startCluster(t)
	createNamespace(t, env.Client, namespace)
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			objs := objects(t, render(t, set))
			if len(objs) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, o := range objs {
				if err := env.Client.Create(t.Context(), o.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict")); err != nil {
					t.Errorf("dry-run create %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		})
	}

	// Pod Security Admission enforces on pods, not on their controllers: the
	// pods the Deployment and the StatefulSet would create are dry-run
	// created in a namespace that enforces the restricted profile.
	t.Run("the pods meet the restricted Pod Security Standard", func(t *testing.T) {
		ctx := t.Context()
		restricted := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted", Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
		}}}
		if err := env.Client.Create(ctx, restricted); err != nil {
			t.Fatal(err)
		}
		objs := objects(t, render(t, "defaults"))
		var d appsv1.Deployment
		var sts appsv1.StatefulSet
		find(t, objs, "Deployment", release+"-stampguard-webhook", &d)
		find(t, objs, "StatefulSet", release+"-stampguard-auditsink", &sts)
		stsSpec := sts.Spec.Template.Spec.DeepCopy()
		for _, c := range sts.Spec.VolumeClaimTemplates { // the controller adds these
			stsSpec.Volumes = append(stsSpec.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		}
		for name, spec := range map[string]*corev1.PodSpec{"webhook": &d.Spec.Template.Spec, "auditsink": stsSpec} {
			for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				if c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false) {
					t.Errorf("%s container %s: root filesystem not read-only", name, c.Name)
				}
			}
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "restricted", Name: name}, Spec: *spec}
			if err := env.Client.Create(ctx, p, client.DryRunAll); err != nil {
				t.Errorf("%s pod refused under the restricted profile: %v", name, err)
			}
		}
	})
}

// kubeconfig writes a kubeconfig for cfg.
func kubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUpgradeKeepsCertificates installs the chart for real into envtest and
// upgrades it with changed values: the generated CA, serving certificates
// and sink token stay, while the changed values take effect.
func TestUpgradeKeepsCertificates(t *testing.T) {
	env := startCluster(t)
	kc := kubeconfig(t, env.Config)
	chart := chartDir(t)
	out, err := helm(t, kc, "install", release, chart, "--namespace", namespace, "--create-namespace", "-f", valuesFile(t, "defaults"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--audit-webhook-config-file=", "auditsink tail", "not Service DNS"} {
		if !strings.Contains(out, want) {
			t.Errorf("NOTES lack %q:\n%s", want, out)
		}
	}
	secrets := []string{
		release + "-stampguard-webhook-tls", release + "-stampguard-webhook-ca",
		release + "-stampguard-auditsink-tls", release + "-stampguard-auditsink-ca", release + "-stampguard-auditsink-token",
	}
	before := map[string]map[string][]byte{}
	for _, name := range secrets {
		before[name] = secretData(t, env.Client, name)
	}
	caBefore := caBundles(t, env.Client)
	if string(caBefore[0]) != string(before[secrets[0]]["ca.crt"]) {
		t.Fatalf("the installed caBundle is not the webhook Secret's ca.crt")
	}

	if _, err := helm(t, kc, "upgrade", release, chart, "--namespace", namespace, "-f", valuesFile(t, "defaults"),
		"--set", "webhook.replicas=3", "--set", "webhook.timeoutSeconds=3", "--set", "auditSink.retention=7d"); err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release + "-stampguard-webhook"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Fatalf("the upgrade did not apply: replicas %v", d.Spec.Replicas)
	}
	for _, name := range secrets {
		after := secretData(t, env.Client, name)
		for k, v := range before[name] {
			if string(after[k]) != string(v) {
				t.Errorf("secret %s: %s changed across the upgrade", name, k)
			}
		}
	}
	caAfter := caBundles(t, env.Client)
	for i := range caAfter {
		if string(caAfter[i]) != string(caBefore[i]) {
			t.Errorf("caBundle %d changed across the upgrade", i)
		}
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	if err := env.Client.Get(t.Context(), types.NamespacedName{Name: release + "-stampguard"}, &m); err != nil {
		t.Fatal(err)
	}
	if got := *m.Webhooks[0].TimeoutSeconds; got != 3 {
		t.Errorf("timeoutSeconds after the upgrade: %d, want 3", got)
	}

	// New names for the sink's certificate: a new serving certificate that
	// names them, signed by the same CA, so the apiserver's trust holds.
	if _, err := helm(t, kc, "upgrade", release, chart, "--namespace", namespace, "-f", valuesFile(t, "defaults"),
		"--set", "auditSink.tls.extraIPAddresses={192.0.2.7}"); err != nil {
		t.Fatal(err)
	}
	sink := release + "-stampguard-auditsink-tls"
	renamed := secretData(t, env.Client, sink)
	if string(renamed["ca.crt"]) != string(before[sink]["ca.crt"]) {
		t.Errorf("the sink's CA changed with its certificate's names")
	}
	if string(renamed["tls.crt"]) == string(before[sink]["tls.crt"]) {
		t.Errorf("the sink's certificate was kept although its names changed")
	}
	verifyServing(t, renamed["ca.crt"], renamed["tls.crt"], renamed["tls.key"], "192.0.2.7")
	if after := secretData(t, env.Client, secrets[0]); string(after["tls.crt"]) != string(before[secrets[0]]["tls.crt"]) {
		t.Errorf("the webhook's certificate changed with the sink's names")
	}

	// The uninstall removes everything the chart made.
	if _, err := helm(t, kc, "uninstall", release, "--namespace", namespace); err != nil {
		t.Fatal(err)
	}
	var left unstructured.UnstructuredList
	left.SetAPIVersion("v1")
	left.SetKind("SecretList")
	if err := env.Client.List(t.Context(), &left, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("%d Secrets left after helm uninstall", len(left.Items))
	}

	// With a fixed cluster IP, the NOTES' kubeconfig names it.
	out, err = helm(t, kc, "install", release, chart, "--namespace", namespace, "--dry-run=server", "-f", valuesFile(t, "ha-sink"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "server: https://10.0.0.200:443/events"; !strings.Contains(out, want) {
		t.Errorf("NOTES lack %q:\n%s", want, out)
	}
}

func secretData(t testing.TB, c client.Client, name string) map[string][]byte {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		t.Fatalf("get secret %s: %v", name, err)
	}
	if len(s.Data) == 0 {
		t.Fatalf("secret %s is empty", name)
	}
	return s.Data
}

func caBundles(t testing.TB, c client.Client) [][]byte {
	t.Helper()
	var m admissionregistrationv1.MutatingWebhookConfiguration
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.Get(t.Context(), types.NamespacedName{Name: release + "-stampguard"}, &m); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(t.Context(), types.NamespacedName{Name: release + "-stampguard"}, &v); err != nil {
		t.Fatal(err)
	}
	return [][]byte{m.Webhooks[0].ClientConfig.CABundle, v.Webhooks[0].ClientConfig.CABundle}
}
