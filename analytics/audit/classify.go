package audit

import (
	"regexp"
	"slices"
	"strings"
)

// The classes of a 409, as analytics/sql.ConflictClass names them. Every
// 409 is in exactly one; any other code is in none ("").
const (
	ClassField              = "field"               // server-side apply: a cause FieldManagerConflict
	ClassAlreadyExists      = "already_exists"      // create of an existing name: not a concurrency conflict
	ClassVersion            = "version"             // a stale resourceVersion: optimistic concurrency at work
	ClassDeletePrecondition = "delete_precondition" // a delete whose uid/resourceVersion precondition failed
	ClassOther              = "other"
)

// ConflictClasses are the classes in the order ConflictClass tests them.
var ConflictClasses = []string{ClassField, ClassAlreadyExists, ClassVersion, ClassDeletePrecondition, ClassOther}

// OptimisticLockMessage is the apiserver's message for a stale
// resourceVersion (analytics/sql's optimisticLock).
const OptimisticLockMessage = "the object has been modified; please apply your changes to the latest version and try again"

// deletePrecondition is analytics/sql's match() pattern for a failed
// delete precondition; RE2 in both, so the same text matches the same
// messages.
var deletePrecondition = regexp.MustCompile(`(UID|ResourceVersion) in the precondition .* does not match`)

// ConflictClass is analytics/sql.ConflictClass for one row: the sink's
// live counters classify as the report does. TestConflictClassAgreesWithSQL
// (package analytics) runs both over the same rows, so the two cannot
// drift apart unnoticed.
func ConflictClass(r *Row) string {
	switch {
	case r.Code != 409:
		return ""
	case slices.Contains(r.CauseReasons, "FieldManagerConflict"):
		return ClassField
	case r.Reason == "AlreadyExists":
		return ClassAlreadyExists
	case r.Reason == "Conflict" && strings.Contains(r.Message, OptimisticLockMessage):
		return ClassVersion
	case r.Reason == "Conflict" && (r.Verb == "delete" || r.Verb == "deletecollection") && deletePrecondition.MatchString(r.Message):
		return ClassDeletePrecondition
	default:
		return ClassOther
	}
}

// IsWrite is analytics/sql.IsWrite: a write attempt (the review APIs store
// nothing).
func IsWrite(r *Row) bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return r.APIGroup != "authentication.k8s.io" && r.APIGroup != "authorization.k8s.io"
	}
	return false
}

// IsRequest is analytics/sql.Request: the one event of a request that
// counts (ResponseComplete, or Panic), dry runs excluded.
func IsRequest(r *Row) bool {
	return (r.Stage == StageResponseComplete || r.Stage == StagePanic) && !r.DryRun
}
