package analytics

import "strings"

// The definitions the report counts by, as SQL over the events columns.
// They are written once, here: the views of the migrations store what they
// select, and analytics/report queries the raw events with the same text.
const (
	// SQLRequest selects each request once: its ResponseComplete event, or
	// its Panic event; dryRun requests are excluded everywhere.
	SQLRequest = `stage IN ('ResponseComplete', 'Panic') AND dry_run = 0`

	// SQLIsWrite is a write attempt; the review APIs store nothing.
	SQLIsWrite = `verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')`

	// SQLIsSuccess is a 2xx answer.
	SQLIsSuccess = `code >= 200 AND code < 300`

	// optimisticLock is the apiserver's message for a stale resourceVersion.
	optimisticLock = `the object has been modified; please apply your changes to the latest version and try again`

	// SQLConflictClass sorts every 409 into exactly one class: field,
	// already_exists, version, delete_precondition or other ('' for
	// anything else).
	SQLConflictClass = `multiIf(code != 409, '',
		has(cause_reasons, 'FieldManagerConflict'), 'field',
		reason = 'AlreadyExists', 'already_exists',
		reason = 'Conflict' AND position(message, '` + optimisticLock + `') > 0, 'version',
		reason = 'Conflict' AND verb IN ('delete', 'deletecollection') AND match(message, '(UID|ResourceVersion) in the precondition .* does not match'), 'delete_precondition',
		'other')`

	// SQLVersionConflict is class 'version' of SQLConflictClass on its own:
	// a cheap filter where only version conflicts matter.
	SQLVersionConflict = `code = 409 AND reason = 'Conflict' AND NOT has(cause_reasons, 'FieldManagerConflict') AND position(message, '` + optimisticLock + `') > 0`

	// SQLLoopPair identifies a (writer, object) pair in loop_successes.
	SQLLoopPair = `cityHash64(writer, api_group, resource, namespace, name)`
)

// Counter is one of request_rollup's counters and what it counts per
// request, over the aliases class (SQLConflictClass) and is_write
// (SQLIsWrite).
type Counter struct{ Name, Cond string }

// Counters are request_rollup's counters, in column order. The first three
// are fixed: the view defines the aliases is_write and class inside them.
var Counters = []Counter{
	{"requests", "1"},
	{"write_attempts", "is_write"},
	{"version_conflicts", "class = 'version'"},
	{"write_version_conflicts", "is_write AND class = 'version'"},
	{"field_conflicts", "class = 'field'"},
	{"already_exists", "class = 'already_exists'"},
	{"delete_precondition_conflicts", "class = 'delete_precondition'"},
	{"stampless_updates", "verb = 'update' AND " + SQLIsSuccess + " AND stamp = ''"},
	{"other_conflicts", "class = 'other'"},
	{"gone", "code = 410"},
}

// rollupSums are the view's sums of Counters per group. ClickHouse lets an
// alias be defined inside the expression that first uses it, so is_write
// and class are defined in the first counters that need them.
var rollupSums = func() string {
	sums := []string{
		"count() AS requests",
		"countIf((" + SQLIsWrite + ") AS is_write) AS write_attempts",
		"countIf((" + SQLConflictClass + " AS class) = 'version') AS version_conflicts",
	}
	for _, c := range Counters[3:] {
		sums = append(sums, "countIf("+c.Cond+") AS "+c.Name)
	}
	return strings.Join(sums, ",\n\t\t\t\t")
}()
