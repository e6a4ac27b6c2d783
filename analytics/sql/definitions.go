// Package sql holds stampguard's analytics SQL: the definitions the report
// counts by, the statements built on them in a typed form that two binders
// render, and the compaction that builds the hour caches from the same
// definitions (hours.go). The report binder (Report) keeps the window as
// bound @name parameters and splits it between the hour caches and the
// raw events; the Grafana binder (Grafana) writes the ClickHouse plugin's
// time macros and Grafana's template variables in their place. The
// package imports neither the ClickHouse driver nor the sink, so the
// dashboards generator can import it.
//
// Every read takes an event once by its identity (DistinctEvents), or
// from a cache built that way: exactness is a property of the SQL, not a
// correction applied to it.
//
// A statement is SQL text with placeholders for what a binder places: the
// database ({db}), the filters ({filters}, {request_filters}), time ({window},
// {events_window}, {raw_window}, {rollup_window}, {bucket}, {end_us}) and
// the retry-loop rows ({loop_conflicts}, {loop_successes}); everything
// else is plain SQL, so a change of meaning is an edit of that text, and
// both binders carry it. Validate checks that a statement declares what
// its text uses.
//
// Every statement runs on ClickHouse 18.16 and on current releases: no
// window functions, no JSONExtract, no toStartOfInterval.
package sql

// The definitions the report counts by, as SQL over the events columns.
// The compaction (hours.go) builds the hour caches from the same text, so
// a cache and a raw read cannot disagree.
const (
	// Request selects each request once: its ResponseComplete event, or
	// its Panic event; dryRun requests are excluded everywhere.
	Request = `stage IN ('ResponseComplete', 'Panic') AND dry_run = 0`

	// IsWrite is a write attempt; the review APIs store nothing.
	IsWrite = `verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')`

	// IsSuccess is a 2xx answer.
	IsSuccess = `code >= 200 AND code < 300`

	// optimisticLock is the apiserver's message for a stale resourceVersion.
	optimisticLock = `the object has been modified; please apply your changes to the latest version and try again`

	// ConflictClass sorts every 409 into exactly one class: field,
	// already_exists, version, delete_precondition or other ('' for
	// anything else).
	ConflictClass = `multiIf(code != 409, '',
		has(cause_reasons, 'FieldManagerConflict'), 'field',
		reason = 'AlreadyExists', 'already_exists',
		reason = 'Conflict' AND position(message, '` + optimisticLock + `') > 0, 'version',
		reason = 'Conflict' AND verb IN ('delete', 'deletecollection') AND match(message, '(UID|ResourceVersion) in the precondition .* does not match'), 'delete_precondition',
		'other')`

	// VersionConflict is class 'version' of ConflictClass on its own: a
	// cheap filter where only version conflicts matter.
	VersionConflict = `code = 409 AND reason = 'Conflict' AND NOT has(cause_reasons, 'FieldManagerConflict') AND position(message, '` + optimisticLock + `') > 0`

	// LoopPair identifies a (writer, object) pair in the success rows.
	LoopPair = `cityHash64(writer, api_group, resource, namespace, name)`

	// SystemWriter is a writer of Kubernetes itself: the control plane's
	// and the nodes' users (system:kube-controller-manager,
	// system:node:…, system:apiserver, …) and the service accounts of
	// kube-system, where the built-in controllers run. Service accounts of
	// other namespaces (operators, workloads) are not: their conflicts
	// are what the dashboards are for.
	SystemWriter = `startsWith(writer, 'system:') AND NOT (startsWith(writer, 'system:serviceaccount:') AND NOT startsWith(writer, 'system:serviceaccount:kube-system:'))`

	// ObjectHash identifies an object in GROUP BY and IN.
	ObjectHash = `cityHash64(api_group, resource, namespace, name)`
)

// Counter is one of hour_requests' counters and what it counts per
// request, over the aliases class (ConflictClass) and is_write (IsWrite).
type Counter struct{ Name, Cond string }

// Counters are hour_requests' counters, in column order.
var Counters = []Counter{
	{"requests", "1"},
	{"write_attempts", "is_write"},
	{"version_conflicts", "class = 'version'"},
	{"write_version_conflicts", "is_write AND class = 'version'"},
	{"field_conflicts", "class = 'field'"},
	{"already_exists", "class = 'already_exists'"},
	{"delete_precondition_conflicts", "class = 'delete_precondition'"},
	{"stampless_updates", "verb = 'update' AND " + IsSuccess + " AND stamp = ''"},
	{"other_conflicts", "class = 'other'"},
	{"gone", "code = 410"},
}
