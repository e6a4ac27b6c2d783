// Package record is the format in which accepted audit events travel from
// the point they are decoded to their ClickHouse insert: a record holds
// the rows and dead letters of one request (or one chunk of a log file)
// of one cluster, and a spool record holds one record.
//
// record.go holds the format: the row layout, defined once, the writer
// (AppendHeader, AppendRow, AppendDeadLetter, which the pipeline's
// Accepter calls as it decodes events) and the one reader (Set.Add, which
// parses records as far as the insert needs: each row's identity, time and
// object, and where its fields start); and, after them, the insert side:
// the events column table, defined once, and the native ClickHouse blocks
// built straight from the records (Set.Events, Events.Load), so that a row
// never becomes an audit.Row between the spool and the insert.
package record
