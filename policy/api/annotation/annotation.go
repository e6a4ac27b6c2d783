// Package annotation defines the audit annotations stampguard's webhooks
// write, once, for the webhook that writes them and for the analytics that
// read them. It imports nothing, so the audit sink can use it without the
// admission machinery.
//
// The apiserver stores an AdmissionResponse's auditAnnotations in the audit
// event's annotations as "<webhook name>/<key>". stampguard's key is the
// rule kind; its value is a JSON array of Entry, in evaluation order.
package annotation

import "encoding/json"

// Domain is stampguard's API group and the suffix of its webhook names.
const Domain = "stampguard.dev"

// The names of the two webhooks, which prefix their annotation keys.
const (
	// StampWebhook is the mutating webhook: stampless updates.
	StampWebhook = "stamp." + Domain
	// FieldsWebhook is the validating webhook: field owners, immutable
	// fields, delete preconditions.
	FieldsWebhook = "fields." + Domain
)

// The rule kinds: each is the key a webhook sets (without its prefix).
const (
	StampMissing       = "stamp-missing"
	FieldOwner         = "field-owner"
	ImmutableField     = "immutable-field"
	DeletePrecondition = "delete-precondition"
)

// The keys as they appear in an audit event.
const (
	StampMissingKey       = StampWebhook + "/" + StampMissing
	FieldOwnerKey         = FieldsWebhook + "/" + FieldOwner
	ImmutableFieldKey     = FieldsWebhook + "/" + ImmutableField
	DeletePreconditionKey = FieldsWebhook + "/" + DeletePrecondition
)

// Match is the part every stampguard key of an audit event contains: the
// webhook name's domain and the separator before the rule kind.
const Match = "." + Domain + "/"

// Kept is what the audit sink keeps of an event's annotations by default:
// every key that names stampguard, a wider net than Match.
const Kept = "stampguard"

// Entry is one decision in an annotation's value.
type Entry struct {
	// Policy is the ConcurrencyPolicy's name.
	Policy string `json:"policy"`
	// Rule names the rule in the spec's words: requireResourceVersion,
	// requireDeletePreconditions, fieldOwners[i], immutableFields[i].
	Rule string `json:"rule"`
	// Action is Deny, Warn or Audit.
	Action string `json:"action"`
	// Path is the field the rule guards.
	Path string `json:"path"`
	// Writer is the user who wrote.
	Writer string `json:"writer"`
}

// Parse reads an annotation's value.
func Parse(value string) ([]Entry, error) {
	var out []Entry
	if err := json.Unmarshal([]byte(value), &out); err != nil {
		return nil, err
	}
	return out, nil
}
