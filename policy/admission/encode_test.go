package admission

import (
	"bytes"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// appendReview writes what encoding/json writes for reviewOut, byte for
// byte, for every shape of answer.
func TestAppendReviewIsEncodingJSON(t *testing.T) {
	quoted := "ConcurrencyPolicy \"p\": metadata.labels[\"team\"] is immutable; \u00e9l\u00e8ve <x> & \\ \n\t\x01 may not change it (a -> b)"
	for name, out := range map[string]responseOut{
		"allowed":           {UID: "u-1", Allowed: true},
		"allowed, warned":   {UID: "u-2", Allowed: true, Warnings: []string{"w1", quoted}, AuditAnnotations: map[string]string{"b": `[{"policy":"p"}]`, "a": "x"}},
		"empty collections": {UID: "u-3", Allowed: true, Warnings: []string{}, AuditAnnotations: map[string]string{}},
		"cannot evaluate":   cannotEvaluate("u-4", 413, errBudget),
		"denied": {UID: "u-5", Status: &statusOut{
			Status: metav1.StatusFailure, Message: quoted, Reason: metav1.StatusReasonInvalid, Code: 422,
			Details: &detailsOut{Name: "cm", Kind: "ConfigMap", Causes: []causeOut{{Type: "FieldValueForbidden", Field: `metadata.labels["team"]`, Message: quoted}, {Type: "FieldValueInvalid", Field: "f"}}},
		}, AuditAnnotations: map[string]string{"immutable-field": "[]"}},
		"details without causes": {UID: "u-6", Status: &statusOut{Status: metav1.StatusFailure, Details: &detailsOut{Group: "apps"}}},
		"empty details":          {UID: "u-7", Status: &statusOut{Status: metav1.StatusFailure, Details: &detailsOut{}}},
	} {
		t.Run(name, func(t *testing.T) {
			var want bytes.Buffer
			enc := json.NewEncoder(&want)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(reviewOut{APIVersion: reviewAPIVersion, Kind: "AdmissionReview", Response: out}); err != nil {
				t.Fatal(err)
			}
			if got := appendReview(nil, &out); string(got) != want.String() {
				t.Fatalf("appendReview:\n%s\nencoding/json:\n%s", got, want.String())
			}
		})
	}
}

// A message quoting invalid UTF-8 still makes an answer the apiserver reads.
func TestAppendReviewReplacesInvalidUTF8(t *testing.T) {
	out := responseOut{UID: "u", Status: &statusOut{Status: metav1.StatusFailure, Message: "bad \xff\xfe value", Code: 422}}
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(appendReview(nil, &out), &rv); err != nil {
		t.Fatal(err)
	}
	if got := rv.Response.Result.Message; got != "bad \uFFFD value" {
		t.Fatalf("message %q", got)
	}
}
