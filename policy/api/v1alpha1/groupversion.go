// Package v1alpha1 holds the ConcurrencyPolicy API (group stampguard.dev).
//
// +kubebuilder:object:generate=true
// +groupName=stampguard.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of ConcurrencyPolicy.
	GroupVersion = schema.GroupVersion{Group: "stampguard.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
