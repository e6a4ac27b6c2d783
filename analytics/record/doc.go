// Package record is the format in which accepted audit events travel from
// the point they are decoded to their ClickHouse insert: a record is the
// rows and dead letters of one request (or one chunk of a log file) of
// one cluster, and a spool record holds one.
//
// The pipeline appends records entry by entry (AppendHeader, AppendRow,
// AppendDeadLetter); the store parses them into a Set (Set.Add, the one
// parser of the format), takes each event once and in the events table's
// order (Set.Events), and builds the insert's native columns straight from
// the records (Events.Load). The row layout (layout.go) and the events
// column table (columns.go) are defined once, here.
package record
