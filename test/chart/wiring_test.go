package chart

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/cmd/webhook/app"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// TestWebhookWiring installs the rendered chart into envtest for real and
// starts the built webhook binary with the rendered Deployment's args and
// env. The apiserver has no cluster DNS and no kubelet, so the webhook
// configurations get a url (same path and port) instead of their service,
// and the binary uses the chart ServiceAccount's token through a kubeconfig
// instead of the in-cluster config; nothing else changes.
func TestWebhookWiring(t *testing.T) {
	env := startCluster(t)
	port, probe := freePort(t), freePort(t)
	// Without kube-proxy the Service port is the container port, and the
	// apiserver dials 127.0.0.1, which the serving certificate must name.
	objs := objects(t, render(t, "", "auditSink.enabled=false",
		"webhook.port="+strconv.Itoa(port), "webhook.service.port="+strconv.Itoa(port),
		"webhook.probePort="+strconv.Itoa(probe), "webhook.tls.extraIPAddresses={127.0.0.1}"))
	name := release + "-stampguard"
	ctx := t.Context()

	createNamespace(t, env.Client, namespace)
	rendered := createRendered(t, env, objs)

	// The apiserver stored the configurations as rendered, but for the url.
	var gotM admissionregistrationv1.MutatingWebhookConfiguration
	var gotV admissionregistrationv1.ValidatingWebhookConfiguration
	getObj(t, env.Client, "", name, &gotM)
	getObj(t, env.Client, "", name, &gotV)
	var wantM admissionregistrationv1.MutatingWebhookConfiguration
	var wantV admissionregistrationv1.ValidatingWebhookConfiguration
	find(t, unstructuredOf(rendered), "MutatingWebhookConfiguration", name, &wantM)
	find(t, unstructuredOf(rendered), "ValidatingWebhookConfiguration", name, &wantV)
	if len(gotM.Webhooks) != 1 || len(gotV.Webhooks) != 1 {
		t.Fatalf("want one webhook in each configuration, got %d and %d", len(gotM.Webhooks), len(gotV.Webhooks))
	}
	// The apiserver adds an empty objectSelector; the chart sets none.
	for _, sel := range []*metav1.LabelSelector{gotM.Webhooks[0].ObjectSelector, gotV.Webhooks[0].ObjectSelector} {
		if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) != 0 {
			t.Fatalf("objectSelector %v: want the apiserver's empty default", sel)
		}
	}
	gotM.Webhooks[0].ObjectSelector, gotV.Webhooks[0].ObjectSelector = nil, nil
	// Before the first policy the chart sets no namespaceSelector either,
	// which the apiserver defaults to {} too.
	for _, p := range []struct{ got, want *metav1.LabelSelector }{
		{gotM.Webhooks[0].NamespaceSelector, wantM.Webhooks[0].NamespaceSelector},
		{gotV.Webhooks[0].NamespaceSelector, wantV.Webhooks[0].NamespaceSelector},
	} {
		if p.want == nil && (p.got == nil || len(p.got.MatchLabels)+len(p.got.MatchExpressions) != 0) {
			t.Fatalf("namespaceSelector %v: want the apiserver's empty default", p.got)
		}
	}
	if wantM.Webhooks[0].NamespaceSelector == nil {
		gotM.Webhooks[0].NamespaceSelector = nil
	}
	if wantV.Webhooks[0].NamespaceSelector == nil {
		gotV.Webhooks[0].NamespaceSelector = nil
	}
	if !equality.Semantic.DeepEqual(wantM.Webhooks, gotM.Webhooks) {
		t.Errorf("stored mutating webhook differs from the render:\n%s", lineDiff(toYAML(t, wantM.Webhooks), toYAML(t, gotM.Webhooks)))
	}
	if !equality.Semantic.DeepEqual(wantV.Webhooks, gotV.Webhooks) {
		t.Errorf("stored validating webhook differs from the render:\n%s", lineDiff(toYAML(t, wantV.Webhooks), toYAML(t, gotV.Webhooks)))
	}
	if *gotM.Webhooks[0].TimeoutSeconds != 2 || *gotM.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail || *gotV.Webhooks[0].FailurePolicy != admissionregistrationv1.Ignore {
		t.Errorf("the chart's defaults did not reach the apiserver: timeout %d, failure policies %s/%s",
			*gotM.Webhooks[0].TimeoutSeconds, *gotM.Webhooks[0].FailurePolicy, *gotV.Webhooks[0].FailurePolicy)
	}

	startWebhook(t, env, objs, probe)

	// Policies the webhook reports Ready on, through the status RBAC.
	createNamespace(t, env.Client, "shop")
	for _, p := range []*v1alpha1.ConcurrencyPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "configmaps"}, Spec: v1alpha1.ConcurrencyPolicySpec{
			Action:                 v1alpha1.ActionDeny,
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{"shop"}},
			RequireResourceVersion: true,
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "deployments"}, Spec: v1alpha1.ConcurrencyPolicySpec{
			Action: v1alpha1.ActionDeny,
			Match:  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: "apps", Resource: "deployments"}}, Namespaces: []string{"shop"}},
			FieldOwners: []v1alpha1.FieldOwner{{
				Path: "spec.replicas", Writers: v1alpha1.Writers{ServiceAccounts: []string{"kube-system/horizontal-pod-autoscaler"}},
			}},
		}},
	} {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatalf("create policy %s: %v", p.Name, err)
		}
		waitReady(t, env.Client, p.Name)
	}

	alice := env.ClientAs(t, "alice")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "settings"}, Data: map[string]string{"k": "v"}}
	if err := alice.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Run("a stampless update of a guarded kind is refused", func(t *testing.T) {
		blind := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "settings"}, Data: map[string]string{"k": "blind"}}
		err := alice.Update(ctx, blind)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `admission webhook "`+webhookconfig.StampWebhookName+`" denied the request`) {
			t.Fatalf("want 422 from the stamp webhook, got %v", err)
		}
	})
	t.Run("a field owner violation is refused", func(t *testing.T) {
		dep := deployment("shop", "web", 2)
		if err := alice.Create(ctx, dep); err != nil {
			t.Fatal(err)
		}
		dep.Spec.Replicas = ptr.To[int32](5)
		err := alice.Update(ctx, dep)
		if err == nil || !strings.Contains(err.Error(), `admission webhook "`+webhookconfig.FieldsWebhookName+`" denied the request`) {
			t.Fatalf("want a denial from the fields webhook, got %v", err)
		}
	})
	t.Run("the break-glass group is not sent to the webhook", func(t *testing.T) {
		ops := env.ClientAs(t, "ops", webhookconfig.DefaultBreakGlassGroup)
		blind := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "settings"}, Data: map[string]string{"k": "emergency"}}
		if err := ops.Update(ctx, blind); err != nil {
			t.Fatalf("break-glass update refused: %v", err)
		}
	})
}

// createRendered creates every rendered object in env. The apiserver has no
// cluster DNS and no kube-proxy, so the webhook configurations get a url
// (the Service's port and path on 127.0.0.1) instead of their Service;
// nothing else changes. It returns the configurations as sent.
func createRendered(t testing.TB, env *kubetest.Env, objs []*unstructured.Unstructured) []client.Object {
	t.Helper()
	var rendered []client.Object
	for _, o := range objs {
		obj := o.DeepCopy()
		switch o.GetKind() {
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			webhooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
			for i := range webhooks {
				wh := webhooks[i].(map[string]any)
				cc := wh["clientConfig"].(map[string]any)
				svc := cc["service"].(map[string]any)
				cc["url"] = fmt.Sprintf("https://127.0.0.1:%v%s", svc["port"], svc["path"])
				delete(cc, "service")
			}
			if err := unstructured.SetNestedSlice(obj.Object, webhooks, "webhooks"); err != nil {
				t.Fatal(err)
			}
			rendered = append(rendered, obj.DeepCopy())
		}
		if err := env.Client.Create(t.Context(), obj, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	return rendered
}

// startWebhook runs the built webhook binary as the rendered Deployment
// runs it, with the chart ServiceAccount's token through a kubeconfig
// instead of the in-cluster config, and waits until it is ready. stop
// ends it (SIGTERM, as the kubelet); the test's end does too.
func startWebhook(t testing.TB, env *kubetest.Env, objs []*unstructured.Unstructured, probe int) (stop func()) {
	t.Helper()
	var d appsv1.Deployment
	find(t, objs, "Deployment", release+"-stampguard-webhook", &d)
	saConfig := rest.AnonymousClientConfig(env.Config)
	saConfig.BearerToken = serviceAccountToken(t, env, d.Spec.Template.Spec.ServiceAccountName)
	pod := podFiles(t, objs, d.Namespace, &d.Spec.Template.Spec)
	c := d.Spec.Template.Spec.Containers[0]
	args := append(pod.remap(c.Args), "--kubeconfig="+kubeconfig(t, saConfig))
	stop = start(t, bintest.Build(t, "./cmd/webhook"), args, pod.env(t, c), d.Spec.Template.Spec.TerminationGracePeriodSeconds)
	waitHTTP(t, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
	return stop
}

func unstructuredOf(objs []client.Object) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*unstructured.Unstructured))
	}
	return out
}

func getObj(t testing.TB, c client.Client, ns, name string, obj client.Object) {
	t.Helper()
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatalf("get %T %s: %v", obj, name, err)
	}
}

func deployment(ns, name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
			},
		},
	}
}

// serviceAccountToken asks the apiserver for a token of the chart's
// ServiceAccount, so that the binary runs with exactly the chart's RBAC.
func serviceAccountToken(t testing.TB, env *kubetest.Env, sa string) string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for ServiceAccount %s: %v", sa, err)
	}
	return tr.Status.Token
}

func waitReady(t testing.TB, c client.Client, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		var p v1alpha1.ConcurrencyPolicy
		if err := c.Get(t.Context(), types.NamespacedName{Name: name}, &p); err != nil {
			return err
		}
		cond := apimeta.FindStatusCondition(p.Status.Conditions, app.ConditionReady)
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != p.Generation {
			return fmt.Errorf("policy %s: Ready condition %+v", name, cond)
		}
		return nil
	})
}

// pod maps a rendered pod's volume mounts to directories in a temporary
// directory, filled from the rendered Secrets the volumes name or, for
// Secrets that exist before the install, from existing.
type pod struct {
	ns     string
	mounts map[string]string // mountPath -> local directory
}

func podFiles(t testing.TB, objs []*unstructured.Unstructured, ns string, spec *corev1.PodSpec, existing ...*corev1.Secret) *pod {
	t.Helper()
	root := t.TempDir()
	p := &pod{ns: ns, mounts: map[string]string{}}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, m := range c.VolumeMounts {
			dir := filepath.Join(root, m.Name)
			p.mounts[m.MountPath] = dir
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			v, ok := volumes[m.Name]
			if !ok || v.Secret == nil {
				continue // a volume claim template or emptyDir: an empty directory
			}
			var s corev1.Secret
			if i := slices.IndexFunc(existing, func(e *corev1.Secret) bool { return e.Name == v.Secret.SecretName }); i >= 0 {
				s = *existing[i]
			} else {
				find(t, objs, "Secret", v.Secret.SecretName, &s)
			}
			items := v.Secret.Items
			if len(items) == 0 {
				for k := range s.Data {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				data, ok := s.Data[it.Key]
				if !ok {
					t.Fatalf("secret %s has no key %s that volume %s mounts", s.Name, it.Key, v.Name)
				}
				if err := os.WriteFile(filepath.Join(dir, it.Path), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return p
}

// podIP is the test's pod IP: the processes listen where the test reaches them.
const podIP = "127.0.0.1"

// remap replaces mount paths in args with the local directories, and
// expands $(POD_IP) as the kubelet expands a container's env in its args.
func (p *pod) remap(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for mp, dir := range p.mounts {
			a = strings.ReplaceAll(a, mp, dir)
		}
		out[i] = strings.ReplaceAll(a, "$(POD_IP)", podIP)
	}
	return out
}

// env resolves the container's env as the kubelet would: values and the
// pod's namespace from the downward API; anything else fails the test.
func (p *pod) env(t testing.TB, c corev1.Container) []string {
	t.Helper()
	var out []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out = append(out, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			out = append(out, e.Name+"="+p.ns)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			out = append(out, e.Name+"="+podIP)
		default:
			t.Fatalf("env %s: the test cannot resolve %+v", e.Name, e.ValueFrom)
		}
	}
	return out
}

// start runs bin with args and env (added to a minimal environment) until
// the test ends or stop is called, then stops it with SIGTERM and expects a
// clean exit within the pod's grace period, as the kubelet would allow.
func start(t testing.TB, bin string, args, env []string, grace *int64) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	logPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	limit := 30 * time.Second // the kubelet's default
	if grace != nil {
		limit = time.Duration(*grace) * time.Second
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					b, _ := os.ReadFile(logPath)
					t.Errorf("%s exited with %v; log:\n%s", filepath.Base(bin), err, tail(b))
				}
			case <-time.After(limit):
				_ = cmd.Process.Kill()
				t.Errorf("%s did not stop within its grace period (%s) after SIGTERM", filepath.Base(bin), limit)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", filepath.Base(bin), tail(b))
		}
	})
	return stop
}

func tail(b []byte) string {
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// run runs bin with args and env to completion and fails on a non-zero exit.
func run(t testing.TB, bin string, args, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, b)
	}
	return string(b)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t testing.TB, c *http.Client, url string) {
	t.Helper()
	eventually(t, 60*time.Second, func() error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

func eventually(t testing.TB, timeout time.Duration, fn func() error) {
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

// tlsClient trusts only caPEM.
func tlsClient(t testing.TB, caPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in PEM")
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}
