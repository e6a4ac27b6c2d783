// Package admissiontest holds the test fixtures that the webhook's test
// packages share: a realistic Deployment, the AdmissionReview the
// apiserver sends for an update of it, and policy sets with the match
// conditions they narrow the webhook configurations by. It exists because
// a package's _test.go files cannot be imported, so policy/admission,
// policy/webhookconfig and cmd/webhook/app kept copies of each other's.
//
// It is imported by tests only (its helpers take a testing.TB and fail it),
// never by the webhook's own code.
package admissiontest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BigDeployment is a realistic Deployment of about 15 KB: several containers
// with env, probes and resources, annotations and managed fields, as the
// apiserver serialises it.
func BigDeployment(replicas int32, image, team string) *appsv1.Deployment {
	labels := map[string]string{"app": "web", "team": team, "app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop"}
	var containers []corev1.Container
	for i, name := range []string{"app", "sidecar", "proxy", "metrics"} {
		c := corev1.Container{
			Name: name, Image: fmt.Sprintf("registry.example.com/shop/%s:%d.4.2", name, i),
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8080 + i), Protocol: corev1.ProtocolTCP}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(int32(8080 + i))}}, PeriodSeconds: 5},
		}
		for j := range 16 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%s_%02d", strings.ToUpper(name), j), Value: fmt.Sprintf("value-%d-%d-lorem-ipsum-dolor-sit-amet", i, j)})
		}
		containers = append(containers, c)
	}
	containers[0].Image = image
	var managed []metav1.ManagedFieldsEntry
	for _, m := range []string{"kubectl-client-side-apply", "helm", "argocd-controller", "kube-controller-manager"} {
		managed = append(managed, metav1.ManagedFieldsEntry{
			Manager: m, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1", FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:deployment.kubernetes.io/revision":{}},"f:labels":{".":{},"f:app":{},"f:team":{}}},"f:spec":{"f:progressDeadlineSeconds":{},"f:replicas":{},"f:revisionHistoryLimit":{},"f:selector":{},"f:strategy":{"f:rollingUpdate":{".":{},"f:maxSurge":{},"f:maxUnavailable":{}},"f:type":{}},"f:template":{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}}}`),
		})
	}
	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "shop", UID: "5f1a7c1e-0b7e-4a59-9d2b-3c1f2a9e8d11", ResourceVersion: "483920", Generation: 17,
			Labels:        labels,
			Annotations:   map[string]string{"deployment.kubernetes.io/revision": "17", "owner": "shop-team", "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 6300)},
			ManagedFields: managed,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			MinReadySeconds: 5,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"checksum/config": "abc"}},
				Spec:       corev1.PodSpec{ServiceAccountName: "web", Containers: containers},
			},
		},
	}
}

// UpdateReview records an UPDATE of the deployment as the apiserver sends it.
func UpdateReview(t testing.TB, user string, old, cur *appsv1.Deployment) []byte {
	t.Helper()
	raw := func(o runtime.Object) runtime.RawExtension {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	rv := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:      "0c9e4b8e-7f2f-4d7c-9d7a-1f2e3d4c5b6a",
			Kind:     metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
			Resource: metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
			Name:     "web", Namespace: "shop", Operation: admissionv1.Update,
			UserInfo: authenticationv1.UserInfo{Username: user, Groups: []string{"system:authenticated", "developers"}},
			Object:   raw(cur), OldObject: raw(old),
			Options: raw(&metav1.UpdateOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "UpdateOptions"}, FieldManager: "kubectl-edit"}),
			DryRun:  ptr.To(false),
		},
	}
	b, err := json.Marshal(rv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
