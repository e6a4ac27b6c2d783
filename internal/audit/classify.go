package audit

import (
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

// isDeletePrecondition is analytics/sql's
// match(message, '(UID|ResourceVersion) in the precondition .* does not match')
// without a regexp (the sink runs it per event): ClickHouse's `.` matches
// newlines too, so the pattern holds when " does not match" follows
// anywhere after the earliest "... in the precondition ".
func isDeletePrecondition(m string) bool {
	end := -1
	for _, p := range []string{"UID in the precondition ", "ResourceVersion in the precondition "} {
		if i := strings.Index(m, p); i >= 0 && (end < 0 || i+len(p) < end) {
			end = i + len(p)
		}
	}
	return end >= 0 && strings.Contains(m[end:], " does not match")
}

// ConflictClass is analytics/sql.ConflictClass for one row: the sink's
// live counters classify as the report does. TestConflictClassAgreesWithSQL
// (package analytics/pipeline) runs both over the same rows, so the two cannot
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
	case r.Reason == "Conflict" && (r.Verb == "delete" || r.Verb == "deletecollection") && isDeletePrecondition(r.Message):
		return ClassDeletePrecondition
	default:
		return ClassOther
	}
}

// WriteVerbs are the verbs of the requests that change objects, in the
// order of analytics/sql's writeVerbs.
var WriteVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// IsWriteVerb reports whether verb is one of WriteVerbs.
func IsWriteVerb(verb string) bool {
	switch verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// IsWrite is analytics/sql.IsWrite: a write attempt (the review APIs store
// nothing).
func IsWrite(r *Row) bool {
	return IsWriteVerb(r.Verb) && r.APIGroup != "authentication.k8s.io" && r.APIGroup != "authorization.k8s.io"
}

// IsRequest is analytics/sql.Request: the one event of a request that
// counts (ResponseComplete, or Panic), dry runs excluded.
func IsRequest(r *Row) bool {
	return (r.Stage == StageResponseComplete || r.Stage == StagePanic) && !r.DryRun
}
