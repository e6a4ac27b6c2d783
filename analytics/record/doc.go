// Package record is the format in which accepted audit events travel from
// the point they are decoded to their ClickHouse insert: a record holds
// the rows and dead letters of one request (or one chunk of a log file)
// of one cluster, and a spool record holds one record.
//
// It has three parts, a file each, as its tests have:
//   - layout.go, the format: the row layout, defined once, the writer
//     (AppendHeader, AppendRow, AppendDeadLetter, which the pipeline's
//     Accepter calls as it decodes events) and the one reader;
//   - set.go, the dedup set: Set.Add parses records only as far as the
//     insert needs (each row's identity, time and object, and where its
//     fields start), and Set.Events takes each identity once, in the
//     events table's order;
//   - columns.go, the insert side: the column table, the one definition
//     of the events tables' columns (package store writes their DDL from
//     Columns), and the native ClickHouse blocks built from it straight
//     from the records (Events.Load), so that a row never becomes an
//     audit.Row between the spool and the insert.
package record
