// Package v1alpha1 holds the ConcurrencyPolicy API (group stampguard.dev).
//
// +kubebuilder:object:generate=true
// +groupName=stampguard.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of ConcurrencyPolicy.
	GroupVersion = schema.GroupVersion{Group: "stampguard.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ConcurrencyPolicy{}, &ConcurrencyPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
