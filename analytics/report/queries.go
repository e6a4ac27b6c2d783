package report

import (
	"slices"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Query is one named analytics statement. The statements live in
// analytics/sql, which the dashboards share; the report renders them with
// asql.Report and binds the window and options as @name parameters.
type Query = asql.Statement

// The report's statements, in report order.
var (
	QueryTotals              = asql.Totals
	QueryConflictsByUser     = asql.ConflictsByUser
	QueryConflictsByResource = asql.ConflictsByResource
	QueryHotObjects          = asql.HotObjects
	QueryRetryLoops          = asql.RetryLoops
	QueryStamplessUpdates    = asql.StamplessUpdates
	QueryLeaseHolderChanges  = asql.LeaseHolderChanges
	QueryPolicyDecisions     = asql.PolicyDecisions
	QueryLostUpdates         = asql.LostUpdates
	QueryFieldFights         = asql.FieldFights
	QueryConflictCauses      = asql.ConflictCauses
	QueryNoopWrites          = asql.NoopWrites
	QueryFieldWriters        = asql.FieldWriters
)

// All lists every statement the report can run.
var All = slices.Concat(asql.ReportStatements, asql.HistoryStatements)

// Statements lists the statements a report with these options runs.
func Statements(o Options) []asql.Statement {
	if o.History {
		return All
	}
	return asql.ReportStatements
}
