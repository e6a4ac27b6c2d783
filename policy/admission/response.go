package admission

import (
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The answer is written with these small types rather than the k8s.io
// AdmissionReview so that encoding stays cheap; a test decodes it with the
// real types.
type reviewOut struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Response   responseOut `json:"response"`
}

type responseOut struct {
	UID              string            `json:"uid"`
	Allowed          bool              `json:"allowed"`
	Status           *statusOut        `json:"status,omitempty"`
	Warnings         []string          `json:"warnings,omitempty"`
	AuditAnnotations map[string]string `json:"auditAnnotations,omitempty"`
}

type statusOut struct {
	Status  string              `json:"status"`
	Message string              `json:"message"`
	Reason  metav1.StatusReason `json:"reason"`
	Code    int32               `json:"code"`
	Details *detailsOut         `json:"details,omitempty"`
}

// detailsOut names the object as the apiserver's own 422 does, so that
// kubectl says `The ConfigMap "x" is invalid: <field>: <message>`.
type detailsOut struct {
	Name   string     `json:"name,omitempty"`
	Group  string     `json:"group,omitempty"`
	Kind   string     `json:"kind,omitempty"`
	Causes []causeOut `json:"causes,omitempty"`
}

type causeOut struct {
	Type    metav1.CauseType `json:"reason"`
	Message string           `json:"message"`
	Field   string           `json:"field"`
}

// annotationValue is one entry of an audit annotation; the value of each
// annotation key is a JSON array of these, in evaluation order.
type annotationValue = annotation.Entry

// answer turns a decision into the AdmissionResponse for one phase.
func answer(uid string, ph phase, d policy.Decision) responseOut {
	out := responseOut{UID: uid, Allowed: true}
	if len(d.Violations) == 0 {
		return out
	}
	out.AuditAnnotations = auditAnnotations(d)
	var denied []policy.Violation
	for _, v := range d.Violations {
		switch v.Action {
		case v1alpha1.ActionDeny:
			denied = append(denied, v)
		case v1alpha1.ActionWarn:
			out.Warnings = append(out.Warnings, v.Message)
		}
	}
	if len(denied) == 0 {
		return out
	}
	out.Allowed = false
	if ph == phaseStamp {
		out.Status = stampStatus(denied)
	} else {
		out.Status = fieldsStatus(denied)
	}
	return out
}

// stampStatus answers in the apiserver's own words for a custom resource
// updated without a resourceVersion, as 422 Invalid. Never 409: clients that
// retry on conflict would loop forever on a request that cannot succeed.
func stampStatus(denied []policy.Violation) *statusOut {
	names := make([]string, 0, len(denied))
	for _, v := range denied {
		names = append(names, `"`+v.Policy+`"`)
	}
	const detail = policy.StampMissingDetail
	return &statusOut{
		Status:  metav1.StatusFailure,
		Reason:  metav1.StatusReasonInvalid,
		Code:    http.StatusUnprocessableEntity,
		Message: "ConcurrencyPolicy " + strings.Join(names, ", ") + ": metadata.resourceVersion: " + detail,
		Details: &detailsOut{Causes: []causeOut{{
			Type: metav1.CauseTypeFieldValueInvalid, Field: "metadata.resourceVersion", Message: detail,
		}}},
	}
}

// fieldsStatus answers a field rule's denial as 422 Invalid with a
// FieldValueForbidden cause per field, as the apiserver answers a change
// of one of its own immutable fields and as a ValidatingAdmissionPolicy
// answers by default: the request, not the caller's permissions, is what
// must change (README, "Refusals: 422 Invalid"). Not 403, which clients
// and people read as RBAC; not 409, which clients retry.
func fieldsStatus(denied []policy.Violation) *statusOut {
	msgs := make([]string, 0, len(denied))
	causes := make([]causeOut, 0, len(denied))
	for _, v := range denied {
		msgs = append(msgs, v.Message)
		causes = append(causes, causeOut{Type: metav1.CauseType(field.ErrorTypeForbidden), Field: v.Path, Message: v.Message})
	}
	return &statusOut{
		Status:  metav1.StatusFailure,
		Reason:  metav1.StatusReasonInvalid,
		Code:    http.StatusUnprocessableEntity,
		Message: strings.Join(msgs, "; "),
		Details: &detailsOut{Causes: causes},
	}
}

// auditAnnotations groups violations by rule kind. Values are deterministic
// because the apiserver refuses a second call that sets the same key to a
// different value.
func auditAnnotations(d policy.Decision) map[string]string {
	out := make(map[string]string, 2)
	var buf []byte
	for i, v := range d.Violations {
		kind := string(v.Rule)
		if _, done := out[kind]; done {
			continue
		}
		buf = append(buf[:0], '[')
		for _, w := range d.Violations[i:] {
			if w.Rule != v.Rule {
				continue
			}
			if len(buf) > 1 {
				buf = append(buf, ',')
			}
			buf = appendEntry(buf, w)
		}
		out[kind] = string(append(buf, ']'))
	}
	return out
}

// appendEntry writes {"policy","rule","action","path","writer"}: the fields
// and order of annotationValue.
func appendEntry(b []byte, v policy.Violation) []byte {
	b = append(b, `{"policy":`...)
	b = rawjson.AppendString(b, v.Policy)
	b = append(b, `,"rule":`...)
	b = rawjson.AppendString(b, v.RuleName())
	b = append(b, `,"action":`...)
	b = rawjson.AppendString(b, string(v.Action))
	b = append(b, `,"path":`...)
	b = rawjson.AppendString(b, v.Path)
	b = append(b, `,"writer":`...)
	b = rawjson.AppendString(b, v.Writer)
	return append(b, '}')
}
