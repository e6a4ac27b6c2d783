// Package analytics is the audit half of stampguard: it stores
// kube-apiserver audit events in ClickHouse so that every figure read from
// them counts each event once, and reports on them. It holds no code; its
// packages, in the order an event passes them:
//
//   - config: the options of every auditsink subcommand, resolved from
//     flags, files and the environment;
//   - sink: the HTTP endpoint of the apiserver's audit webhook, and
//     serve's wiring;
//   - internal/audit (shared with policy/replay): decoding an audit event
//     into a Row, and what a row means (requests, writes, conflict
//     classes);
//   - pipeline: the Accepter, the spool or a Queue, the Drainer and its
//     insert retries, ingest and tail, the periodic jobs and the sink's
//     metrics;
//   - record: the record format between decoding and insert, and the
//     insert's native columns built from it;
//   - spool: serve's durable buffer of records;
//   - internal/logfile (shared with policy/replay): reading and following
//     audit log files;
//   - store: ClickHouse: connection, migrations, insert, hour caches,
//     retention;
//   - sql: every SQL text the store, the report and the dashboards run;
//   - report: the report over the stored events.
//
// One event from the HTTP handler to a ClickHouse row: sink/server.go
// (the handler), pipeline/pipeline.go (the Accepter, which has
// internal/audit/decode.go decode it and record/layout.go encode it; then the
// Drainer, which has record.Set.Add parse it), spool/spool.go between the
// two (its framing in spool/format.go), and store/store.go (InsertRecords,
// with the columns of record/columns.go).
package analytics
