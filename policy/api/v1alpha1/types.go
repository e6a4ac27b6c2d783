package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Action says what happens to a write that breaks a rule.
// +kubebuilder:validation:Enum=Deny;Warn;Audit
type Action string

const (
	// ActionDeny refuses the write.
	ActionDeny Action = "Deny"
	// ActionWarn lets the write through with a warning to the client.
	ActionWarn Action = "Warn"
	// ActionAudit lets the write through and only records an audit annotation.
	ActionAudit Action = "Audit"
)

// DeletePrecondition names the precondition a delete must carry.
// +kubebuilder:validation:Enum=none;uid;resourceVersion
type DeletePrecondition string

const (
	// DeletePreconditionNone requires nothing (the default).
	DeletePreconditionNone DeletePrecondition = "none"
	// DeletePreconditionUID requires preconditions.uid.
	DeletePreconditionUID DeletePrecondition = "uid"
	// DeletePreconditionResourceVersion requires preconditions.resourceVersion.
	DeletePreconditionResourceVersion DeletePrecondition = "resourceVersion"
)

// ImmutableMode says when an immutable field may still be written.
// +kubebuilder:validation:Enum=Always;OnceSet
type ImmutableMode string

const (
	// ImmutableAlways refuses any change, including setting and removing the field.
	ImmutableAlways ImmutableMode = "Always"
	// ImmutableOnceSet lets a field that is absent be set once; after that it is fixed.
	ImmutableOnceSet ImmutableMode = "OnceSet"
)

// ConcurrencyPolicy guards writers of the matched resources: it refuses
// stampless updates, keeps one writer per field, fixes immutable fields and
// asks deletes for preconditions.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=cpol,categories=stampguard
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.action`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ConcurrencyPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ConcurrencyPolicySpec   `json:"spec"`
	Status ConcurrencyPolicyStatus `json:"status,omitempty"`
}

// ConcurrencyPolicySpec is what a policy enforces and where.
type ConcurrencyPolicySpec struct {
	// Action for every rule of this policy unless the rule overrides it.
	// Defaults to Deny.
	// +optional
	Action Action `json:"action,omitempty"`

	// Match selects the requests this policy applies to.
	Match Match `json:"match"`

	// RequireResourceVersion refuses updates that carry no
	// metadata.resourceVersion (blind overwrites).
	// +optional
	RequireResourceVersion bool `json:"requireResourceVersion,omitempty"`

	// RequireResourceVersionAction overrides Action for the stamp rule.
	// +optional
	RequireResourceVersionAction Action `json:"requireResourceVersionAction,omitempty"`

	// RequireDeletePreconditions asks deletes for a uid or resourceVersion
	// precondition. Defaults to none.
	// +optional
	RequireDeletePreconditions DeletePrecondition `json:"requireDeletePreconditions,omitempty"`

	// DeletePreconditionsAction overrides Action for the delete rule.
	// +optional
	DeletePreconditionsAction Action `json:"deletePreconditionsAction,omitempty"`

	// DeletePreconditionExemptUsers may delete without preconditions. When
	// unset, the namespace controller and the garbage collector are exempt.
	// Set it to an empty list to exempt nobody.
	// +optional
	DeletePreconditionExemptUsers *[]string `json:"deletePreconditionExemptUsers,omitempty"`

	// DeleteCollectionExempt lets the per-item deletes of a deletecollection
	// through without preconditions (they can never carry one). Defaults to true.
	// +optional
	DeleteCollectionExempt *bool `json:"deleteCollectionExempt,omitempty"`

	// FieldOwners gives fields a single set of writers.
	// +optional
	// +listType=atomic
	FieldOwners []FieldOwner `json:"fieldOwners,omitempty"`

	// ImmutableFields may not change once written.
	// +optional
	// +listType=atomic
	ImmutableFields []ImmutableField `json:"immutableFields,omitempty"`
}

// Match selects requests by resource, namespace and writer.
type Match struct {
	// Resources lists the guarded resources. "*" matches any group or any
	// resource, but never events, leases, or a subresource that is not named.
	// +kubebuilder:validation:MinItems=1
	// +listType=atomic
	Resources []ResourceMatch `json:"resources"`

	// Namespaces limits the policy to these namespaces. Empty means all,
	// except the webhook's own namespace, kube-system and kube-node-lease,
	// which are covered only when named here.
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector limits the policy to namespaces whose labels match.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// ExcludeUsers are never checked by this policy.
	// +optional
	// +listType=set
	ExcludeUsers []string `json:"excludeUsers,omitempty"`

	// ExcludeGroups are never checked by this policy.
	// +optional
	// +listType=set
	ExcludeGroups []string `json:"excludeGroups,omitempty"`
}

// ResourceMatch names a resource by API group and plural name.
type ResourceMatch struct {
	// Group is the API group ("" for core, "*" for any).
	// +optional
	Group string `json:"group"`

	// Resource is the plural resource name, "*" for any, or
	// "resource/subresource" to guard a subresource.
	// +kubebuilder:validation:MinLength=1
	Resource string `json:"resource"`
}

// FieldOwner says who may change the value at Path.
type FieldOwner struct {
	// Path of the field: dotted names, ["key"] map keys, [*] every list
	// item, [name=app] the list item whose name field is app.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`

	// Writers may change the field; nobody else may.
	Writers Writers `json:"writers"`

	// OnCreate also checks creates that set the field. Defaults to false.
	// +optional
	OnCreate bool `json:"onCreate,omitempty"`

	// Action overrides the policy's action for this rule.
	// +optional
	Action Action `json:"action,omitempty"`
}

// Writers identifies writers by their authenticated identity. Field managers
// are asserted by the client, so they only narrow an identity match; alone
// they match any identity that claims them.
type Writers struct {
	// ServiceAccounts as namespace/name.
	// +optional
	// +listType=set
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// Users by username.
	// +optional
	// +listType=set
	Users []string `json:"users,omitempty"`
	// Groups the writer belongs to.
	// +optional
	// +listType=set
	Groups []string `json:"groups,omitempty"`
	// FieldManagers the request must name (options.fieldManager).
	// +optional
	// +listType=set
	FieldManagers []string `json:"fieldManagers,omitempty"`
}

// ImmutableField is a field that may not change once written.
type ImmutableField struct {
	// Path of the field, in the same syntax as FieldOwner.Path.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`

	// Mode is Always (default) or OnceSet.
	// +optional
	Mode ImmutableMode `json:"mode,omitempty"`

	// Action overrides the policy's action for this rule.
	// +optional
	Action Action `json:"action,omitempty"`
}

// ConcurrencyPolicyStatus reports whether the policy is in force.
type ConcurrencyPolicyStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready is True when the policy compiled and is enforced.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// ConcurrencyPolicyList is a list of ConcurrencyPolicy.
type ConcurrencyPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ConcurrencyPolicy `json:"items"`
}
