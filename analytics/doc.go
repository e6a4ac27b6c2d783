// Package analytics stores kube-apiserver audit events in ClickHouse
// exactly once, and runs the pipelines that bring them there.
//
// One audit event travels like this: the sink's HTTP handler (package
// sink) or a log file reader (package logfile, for ingest and tail) hands
// raw events to the Accepter (accept.go), which decodes each into an
// audit.Row (package audit) and encodes the rows of one request into a
// record (record.go). The sink appends records to the spool (package
// spool); the Drainer (writer.go) drains spool records, or a Queue's
// (queue.go), into the Store (store.go), which parses them into a
// RecordSet (recordset.go), drops events already stored, and builds the
// ClickHouse columns straight from the records (columns.go). The schema
// is schema.go's Migrations over the definitions of package sql.
package analytics
