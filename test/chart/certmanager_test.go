package chart

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestCertManagerWiring: with cert-manager, the chart generates no TLS
// Secret; each workload mounts the Secret its Certificate writes, the
// Certificates name the Services, and the cainjector annotation points at
// the webhook's Certificate.
func TestCertManagerWiring(t *testing.T) {
	for _, set := range []string{"cert-manager", "existing-secrets"} {
		t.Run(set, func(t *testing.T) {
			objs := objects(t, render(t, set))
			name := release + "-stampguard"
			for _, s := range kinds(objs, "Secret") {
				if strings.HasSuffix(s.GetName(), "-tls") {
					t.Errorf("the chart generated TLS Secret %s although cert-manager issues it", s.GetName())
				}
			}
			var d appsv1.Deployment
			var sts appsv1.StatefulSet
			find(t, objs, "Deployment", name+"-webhook", &d)
			find(t, objs, "StatefulSet", name+"-auditsink", &sts)
			for svc, mounted := range map[string]string{
				name + "-webhook":   secretVolume(d.Spec.Template.Spec.Volumes, "tls"),
				name + "-auditsink": secretVolume(sts.Spec.Template.Spec.Volumes, "tls"),
			} {
				cert := certificate(t, objs, svc)
				if got, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); got != mounted {
					t.Errorf("Certificate %s writes %q, the workload mounts %q", svc, got, mounted)
				}
				dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
				if !slices.Contains(dns, svc+"."+namespace+".svc") {
					t.Errorf("Certificate %s: dnsNames %v lack the Service's name", svc, dns)
				}
			}
			for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
				for _, o := range kinds(objs, kind) {
					ref := o.GetAnnotations()["cert-manager.io/inject-ca-from"]
					if ref != namespace+"/"+name+"-webhook" {
						t.Errorf("%s: inject-ca-from %q, want the webhook's Certificate", kind, ref)
					}
				}
			}
		})
	}
}

func secretVolume(volumes []corev1.Volume, name string) string {
	for _, v := range volumes {
		if v.Name == name && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

func certificate(t testing.TB, objs []*unstructured.Unstructured, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range kinds(objs, "Certificate") {
		if o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no Certificate %s rendered", name)
	return nil
}
