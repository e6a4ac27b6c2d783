// Command demo starts a real kube-apiserver and etcd, runs the stampguard
// webhook against them with the example policies, and plays the writes that
// stampguard exists to catch. `make demo` runs it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/internal/kubetest"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

func main() { os.Exit(run()) }

func run() int {
	bin := flag.String("bin", "bin", "directory with kube-apiserver and etcd")
	crds := flag.String("crds", "charts/stampguard/crds", "CRD directory")
	policies := flag.String("policies", "examples/policies.yaml", "policies to apply")
	keep := flag.Bool("keep", false, "keep the control plane running after the scenario (Ctrl-C ends it)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, *bin, *crds, *policies, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		return 1
	}
	return 0
}

func step(format string, args ...any) { fmt.Printf("\n\033[1m==> "+format+"\033[0m\n", args...) }

func outcome(err error) {
	if err == nil {
		fmt.Println("    allowed")
		return
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		fmt.Printf("    refused: %d %s\n    %s\n", st.Status().Code, st.Status().Reason, st.Status().Message)
		return
	}
	fmt.Println("    error:", err)
}

type printWarnings struct{}

func (printWarnings) HandleWarningHeader(_ int, _ string, text string) {
	fmt.Printf("    warning from the apiserver: %s\n", text)
}

func demo(ctx context.Context, bin, crds, policyFile string, keep bool) error {
	dir, err := os.MkdirTemp("", "stampguard-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	step("starting kube-apiserver and etcd from %s", bin)
	env, err := kubetest.New(kubetest.Options{
		BinDir: bin, CRDDirs: []string{crds}, Dir: dir,
		AuditPolicy: kubetest.DefaultAuditPolicy, AuditLog: true,
	})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()

	step("starting the stampguard webhook (cluster mode) and registering it")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- admission.Run(wctx, admission.Options{
			Host: env.WebhookHost, Port: env.WebhookPort, CertDir: env.CertDir, ProbeAddr: "0",
			RestConfig: env.Config, Logger: slog.New(slog.DiscardHandler),
			Ready: func(string) { close(ready) },
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("webhook: %w", err)
	case <-time.After(time.Minute):
		return errors.New("webhook not ready after a minute")
	}
	mut, val := admission.Configurations(admission.ConfigOptions{URL: env.WebhookURL(), CABundle: env.CAData})
	if err := env.Client.Create(ctx, mut); err != nil {
		return err
	}
	if err := env.Client.Create(ctx, val); err != nil {
		return err
	}

	step("applying %s", policyFile)
	if err := applyPolicies(ctx, env, policyFile); err != nil {
		return err
	}

	admin := kubernetes.NewForConfigOrDie(env.Config)
	as := func(user string) *kubernetes.Clientset {
		cfg := env.As(user)
		cfg.WarningHandler = printWarnings{}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	alice, hpa := as("alice"), as("system:serviceaccount:kube-system:horizontal-pod-autoscaler")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	d, err := alice.AppsV1().Deployments("shop").Create(ctx, webDeployment(), metav1.CreateOptions{})
	if err != nil {
		return err
	}

	step("alice PUTs a Deployment she built from scratch (no resourceVersion): a blind overwrite")
	blind := webDeployment()
	blind.Spec.Template.Spec.Containers[0].Image = "registry.example/web:2"
	_, err = alice.AppsV1().Deployments("shop").Update(ctx, blind, metav1.UpdateOptions{})
	outcome(err)

	step("alice changes spec.replicas, which the HPA owns")
	d.Spec.Replicas = ptr.To[int32](5)
	_, err = alice.AppsV1().Deployments("shop").Update(ctx, d, metav1.UpdateOptions{})
	outcome(err)

	step("the HPA scales the Deployment through /scale")
	s, err := hpa.AppsV1().Deployments("shop").GetScale(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.Spec.Replicas = 4
	_, err = hpa.AppsV1().Deployments("shop").UpdateScale(ctx, "web", s, metav1.UpdateOptions{})
	outcome(err)

	step("alice rolls out a new image with a fresh read (stamped)")
	d, err = alice.AppsV1().Deployments("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return err
	}
	d.Spec.Template.Spec.Containers[0].Image = "registry.example/web:2"
	_, err = alice.AppsV1().Deployments("shop").Update(ctx, d, metav1.UpdateOptions{})
	outcome(err)

	step("alice deletes the Deployment without a uid precondition")
	outcome(alice.AppsV1().Deployments("shop").Delete(ctx, "web", metav1.DeleteOptions{}))

	step("alice deletes it with a uid precondition")
	outcome(alice.AppsV1().Deployments("shop").Delete(ctx, "web", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &d.UID}}))

	step("a script PUTs a ConfigMap without resourceVersion (the configmaps policy only warns)")
	if _, err := alice.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"schema-version": "1"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err = alice.CoreV1().ConfigMaps("shop").Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"schema-version": "2"}}, metav1.UpdateOptions{})
	outcome(err)

	step("what the apiserver's audit log recorded from stampguard (annotations)")
	time.Sleep(500 * time.Millisecond)
	if err := printAnnotations(env.AuditLogPath); err != nil {
		return err
	}

	if keep {
		fmt.Printf("\nThe control plane keeps running at %s; Ctrl-C ends it. Audit log: %s\n", env.Config.Host, env.AuditLogPath)
		<-ctx.Done()
	}
	step("done")
	cancel()
	return <-done
}

func applyPolicies(ctx context.Context, env *kubetest.Env, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(data), "\n---") {
		var p v1alpha1.ConcurrencyPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := env.Client.Create(ctx, &p); err != nil {
			return err
		}
		fmt.Printf("    ConcurrencyPolicy %q (%s)\n", p.Name, p.Spec.Action)
	}
	// Give the webhook's informer a moment to see them.
	time.Sleep(time.Second)
	return nil
}

func printAnnotations(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if !bytes.Contains(line, []byte(`stampguard.dev/`)) || !bytes.Contains(line, []byte(`"stage":"ResponseComplete"`)) {
			continue
		}
		var ev struct {
			Verb         string                          `json:"verb"`
			User         struct{ Username string }       `json:"user"`
			Impersonated *struct{ Username string }      `json:"impersonatedUser"`
			ObjectRef    struct{ Resource, Name string } `json:"objectRef"`
			Response     struct{ Code int }              `json:"responseStatus"`
			Annotations  map[string]string               `json:"annotations"`
		}
		if err := yaml.Unmarshal(line, &ev); err != nil {
			continue
		}
		if ev.Impersonated != nil {
			ev.User.Username = ev.Impersonated.Username
		}
		for k, v := range ev.Annotations {
			if strings.Contains(k, "stampguard.dev/") {
				fmt.Printf("    %s %s/%s by %s -> %d\n      %s: %s\n", ev.Verb, ev.ObjectRef.Resource, ev.ObjectRef.Name, ev.User.Username, ev.Response.Code, k, v)
			}
		}
	}
	return nil
}

func webDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Labels: map[string]string{"team": "storefront"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}},
			},
		},
	}
}

var _ rest.WarningHandler = printWarnings{}
