package admission

import "github.com/stampguard/stampguard/policy"

// Verdict is the webhook's answer to one phase's decision, built by the
// same code that answers an AdmissionReview: what a replay of the audit
// log reports as the webhook's answer.
type Verdict struct {
	// Allowed is false when a Deny rule was broken.
	Allowed bool
	// Code and Message are the refusal's HTTP code and the message the
	// client sees; zero when allowed.
	Code    int32
	Message string
	// Warnings are the Warn rules' messages.
	Warnings []string
	// Annotations are the audit annotations the webhook sets, by key
	// without the webhook's name.
	Annotations map[string]string
}

// StampVerdict answers the stamp phase's decision (policy.Set.CheckStamp).
func StampVerdict(d policy.Decision) Verdict { return verdictOf(answer("", phaseStamp, d)) }

// FieldsVerdict answers the fields phase's decision (policy.Set.CheckFields).
func FieldsVerdict(d policy.Decision) Verdict { return verdictOf(answer("", phaseFields, d)) }

func verdictOf(r responseOut) Verdict {
	v := Verdict{Allowed: r.Allowed, Warnings: r.Warnings, Annotations: r.AuditAnnotations}
	if r.Status != nil {
		v.Code, v.Message = r.Status.Code, r.Status.Message
	}
	return v
}
